// Key-value rendezvous store (torch.distributed's Store): every call has a
// timeout, and a key that does not appear in time is a StoreTimeoutError naming it.
#pragma once

#include "runtime/error.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class StoreError : public Error {
  using Error::Error;
};
class StoreTimeoutError : public StoreError {
  using StoreError::StoreError;
};

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to the store's timeout) for the key to exist.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to an integer key (created as 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits for every key to exist; StoreTimeoutError names the missing ones. `timeout`:
  // the store's own when absent; 0 waits without a limit (torch's kNoTimeout; the TCP
  // store's server keeps a wait 30 days at most); a negative one is a ValueError.
  virtual void wait(const std::vector<std::string>& keys,
                    std::optional<std::chrono::milliseconds> timeout = std::nullopt) = 0;
  // Sets key to `desired` if its value is `expected` (or if it is absent and
  // `expected` is empty); returns the value after the call.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  virtual bool delete_key(const std::string& key) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;  // all exist, without waiting
  virtual std::chrono::milliseconds timeout() const = 0;

  void set(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    const Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }
};

}  // namespace ddp
