// Helpers shared by the server tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "engine/engine.h"
#include "test_util.h"

namespace specinfer::testing {

// The stories260K engine (llama2.c checkpoint shipped under tests/data; context 512), or null
// after a gtest failure.
inline std::unique_ptr<Engine> Stories260KEngine(int32_t threads = 1) {
  EngineOptions o;
  o.model_path = Stories260KModel();
  o.tokenizer_path = Stories260KTokenizer();
  o.num_threads = threads;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

}  // namespace specinfer::testing
