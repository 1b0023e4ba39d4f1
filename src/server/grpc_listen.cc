#include "server/grpc_listen.h"

#include <algorithm>
#include <limits>

namespace specinfer {

StatusOr<BoundGrpcServer> BindGrpcServer(std::span<grpc::Service* const> services,
                                            const GrpcListenOptions& options) {
  BoundGrpcServer started;
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &started.port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::clamp<int64_t>(options.max_receive_bytes, 0, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(-1);
  for (grpc::Service* service : services) builder.RegisterService(service);
  started.server = builder.BuildAndStart();
  if (!started.server || started.port == 0)
    return UnavailableError("cannot bind " + options.address);
  return started;
}

}  // namespace specinfer
