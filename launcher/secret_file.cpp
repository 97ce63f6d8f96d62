#include "launcher/secret_file.h"

#include "launcher/options.h"
#include "runtime/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddp::launcher {

// O_NONBLOCK: opening a FIFO for reading would wait for a writer for ever; the
// fstat() after it refuses anything but a regular file, so nothing is read
// from one (regular files ignore O_NONBLOCK). Like ssh with a private key, a
// file owned by another user is refused: they could change the secret.
std::string read_secret_file(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  DDP_CHECK_T(UsageError, static_cast<bool>(fd), "--store-secret-file {}: cannot open it: {}", path,
              std::strerror(errno));
  struct stat st {};
  DDP_CHECK_T(UsageError, ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode),
              "--store-secret-file {}: not a regular file (a FIFO, a device or a directory); "
              "write the secret into a plain file of mode 0600",
              path);
  DDP_CHECK_T(UsageError, st.st_uid == ::geteuid(),
              "--store-secret-file {}: owned by uid {}, not by this user (uid {}), who could not "
              "trust it; copy it into a file of your own: install -m 600 {} ~/.ddp-secret",
              path, st.st_uid, ::geteuid(), path);
  const unsigned mode = st.st_mode & 07777;
  DDP_CHECK_T(UsageError, (mode & 077) == 0,
              "--store-secret-file {}: mode {:04o} lets others read or change the secret; it must "
              "be private to its owner: chmod 600 {}",
              path, mode, path);
  std::string secret;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    DDP_CHECK_T(UsageError, n >= 0, "--store-secret-file {}: cannot read it: {}", path,
                std::strerror(errno));
    if (n == 0) break;
    secret.append(buffer, static_cast<size_t>(n));
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  DDP_CHECK_T(UsageError, !secret.empty(),
              "--store-secret-file {}: the file is empty; write a secret into it, e.g. "
              "openssl rand -hex 16 > {}",
              path, path);
  return secret;
}

}  // namespace ddp::launcher
