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

grpc::ChannelArguments WorkerChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);  // the connection attempt's timeout
  return args;
}

}  // namespace specinfer
