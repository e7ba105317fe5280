#pragma once
// Files written whole or not at all (checkpoints, ONNX exports, the tuning cache): the bytes go to
// <path>.tmp beside <path>, which is flushed, fsynced and renamed over <path>; then the folder is
// fsynced. The folder must exist. On failure the temporary file is removed and a file already at
// <path> is untouched.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

// How write_file_atomically writes.
struct AtomicWrite {
    // The temporary file is <path>.<pid>-<n>-<clock>.tmp, unique to the call, so that several threads
    // or processes may write the same path at once: each rename replaces the file whole, the last
    // one stays. Off: <path>.tmp, for one writer.
    bool unique_temporary = false;
    // The file and its folder are fsynced before and after the rename, so that the new file survives
    // a power loss. Off (a cache whose reader checks every byte): the rename alone, which readers see
    // atomically; after a power loss the file may be cut short or empty.
    bool sync = true;
};

// Writes `bytes` to `path` atomically. Errors begin with `failure` (what could not be written, e.g.
// "cannot write checkpoint <path>"), name the step and the OS error, and end with `kept` (what the
// caller keeps, e.g. "the previous checkpoint, if any, is unchanged") and what to check.
inline void write_file_atomically(const std::filesystem::path& path, std::span<const unsigned char> bytes,
                                  const std::string& failure, const std::string& kept, AtomicWrite how = {})
{
    namespace fs = std::filesystem;
    const std::string advice = ": check that the directory is writable and has free space";
    fs::path tmp = path;
    if (how.unique_temporary) {
        static std::atomic<unsigned long> calls{0};
        const auto clock = std::chrono::steady_clock::now().time_since_epoch().count();
        tmp += "." + std::to_string(::getpid()) + "-" + std::to_string(calls++) + "-" + std::to_string(clock);
    }
    tmp += ".tmp";
    std::FILE* file = std::fopen(tmp.c_str(), "wb");
    if (!file)
        throw Error(failure + ": creating " + tmp.string() + " failed: " + std::strerror(errno) + "; " + kept + advice);
    // Takes errno first: closing and removing may change it.
    auto fail = [&](const std::string& step) {
        const int err = errno;
        if (file) std::fclose(file);
        std::error_code ignored;
        fs::remove(tmp, ignored);
        throw Error(failure + ": " + step + " failed: " + std::strerror(err) + "; " + kept + advice);
    };
    errno = 0;
    if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) fail("writing " + tmp.string());
    if (std::fflush(file) != 0) fail("flushing " + tmp.string());
    if (how.sync && ::fsync(::fileno(file)) != 0) fail("syncing " + tmp.string());
    const int closed = std::fclose(file);
    file = nullptr;
    if (closed != 0) fail("closing " + tmp.string());
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming " + tmp.string() + " to " + path.string());
    if (!how.sync) return;

    const fs::path parent = path.parent_path();
    const fs::path dir = parent.empty() ? fs::path(".") : parent;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0 || ::fsync(fd) != 0) {
        const int err = errno;
        if (fd >= 0) ::close(fd);
        throw Error(path.string() + " was written, but syncing its directory " + dir.string() + " failed: " +
                    std::strerror(err) + "; it may not survive a power loss" + advice);
    }
    ::close(fd);
}

} // namespace replica::core
