#include "model/loader.h"

#include <filesystem>
#include <fstream>

#include "model/llama2c_loader.h"

namespace specinfer {

StatusOr<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("model '" + path + "' not found");
  if (std::filesystem::is_directory(path, ec))
    return UnimplementedError("'" + path + "' is a directory; Hugging Face model directories "
                              "are not supported yet, pass a GGUF or llama2.c file");
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string_view(magic, 4) == "GGUF") return ModelFormat::kGguf;
  return ModelFormat::kLlama2c;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  SI_ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  switch (format) {
    case ModelFormat::kLlama2c:
      return LoadLlama2cCheckpoint(path);
    case ModelFormat::kGguf:
      return UnimplementedError("GGUF models are not supported yet: '" + path + "'");
  }
  return InternalError("unknown model format");
}

}  // namespace specinfer
