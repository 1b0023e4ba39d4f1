# cmake -P cuda_architectures_test.cmake SOURCE_DIR: a build configured without
# SPECINFER_CUDA_ARCHITECTURES compiles CUDA device code for both sm_80 (A100) and sm_90
# (H100/H200). CI compiles for sm_90 alone to save time (.ci/run); users' builds must not.
# Reads the option's default from CMakeLists.txt and checks that scripts/setup.sh and
# scripts/serve.sh, the users' ways in, do not narrow it.
cmake_minimum_required(VERSION 3.24)
set(src ${CMAKE_ARGV3})
file(READ ${src}/CMakeLists.txt top)
string(REGEX MATCH "set\\(SPECINFER_CUDA_ARCHITECTURES \"([0-9;]+)\" CACHE" found "${top}")
if(NOT found)
  message(FATAL_ERROR "FAIL: no default for SPECINFER_CUDA_ARCHITECTURES in CMakeLists.txt")
endif()
set(archs ${CMAKE_MATCH_1})
foreach(want 80 90)
  if(NOT want IN_LIST archs)
    message(FATAL_ERROR "FAIL: the default CUDA architectures are ${archs}: sm_${want} missing")
  endif()
endforeach()
foreach(script scripts/setup.sh scripts/serve.sh scripts/run.sh)
  file(READ ${src}/${script} text)
  if(text MATCHES "SPECINFER_CUDA_ARCHITECTURES")
    message(FATAL_ERROR "FAIL: ${script} sets SPECINFER_CUDA_ARCHITECTURES")
  endif()
endforeach()
message("default CUDA architectures: ${archs}\n1 passed, 0 failed")
