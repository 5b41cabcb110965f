// The one exception family ladle throws. Every message names the argument or resource at
// fault and what was expected, so a user can act on it without reading ladle's source.
#pragma once

#include <stdexcept>
#include <string>

namespace ladle {

// Base of everything ladle throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something ladle cannot use (shape, dtype, option, path).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A shared library ladle opens at run time (libcuda, libnvrtc) is missing or too old.
class LibraryUnavailable : public Error {
 public:
  using Error::Error;
};

// No CUDA driver on this machine (libcuda.so.1 could not be opened) or no usable device.
// Code that has a CPU path catches this one and falls back.
class NoCudaDriver : public LibraryUnavailable {
 public:
  using LibraryUnavailable::LibraryUnavailable;
};

// A CUDA driver API call failed; code() is the CUresult.
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// NVRTC rejected a program. log() is NVRTC's full log; source_path() is where the failing
// source was written so that it can be opened, edited and recompiled by hand.
class CompileError : public Error {
 public:
  CompileError(const std::string& what, std::string log, std::string source_path)
      : Error(what), log_(std::move(log)), source_path_(std::move(source_path)) {}
  const std::string& log() const noexcept { return log_; }
  const std::string& source_path() const noexcept { return source_path_; }

 private:
  std::string log_;
  std::string source_path_;
};

}  // namespace ladle
