// --store-secret-file: the store's secret from a file only its owner can read.
#pragma once

#include <string>

namespace ddp::launcher {

// The file's content without the trailing newline. Throws UsageError naming
// the file when it cannot be read, is empty, or when its group or others may
// read or write it (like ssh with a private key: the fix is `chmod 600 FILE`).
std::string read_secret_file(const std::string& path);

}  // namespace ddp::launcher
