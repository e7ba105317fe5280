#pragma once
// What the fuzz targets share: the input bytes written to a file of this process's own, since the
// readers under test take a path (as users call them).

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace replica::fuzz {

// A file in $TMPDIR (or /tmp), named by the process id, removed at exit.
class ScratchFile {
public:
    explicit ScratchFile(const std::string& suffix)
    {
        const char* dir = std::getenv("TMPDIR");
        path_ = std::filesystem::path(dir && *dir ? dir : "/tmp") /
                ("replica-fuzz-" + std::to_string(::getpid()) + suffix);
    }
    ~ScratchFile()
    {
        std::error_code ignored;
        std::filesystem::remove(path_, ignored);
    }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;

    // Replaces the file's content with data[0, size). Aborts (a finding) when it cannot be written.
    const std::filesystem::path& write(const std::uint8_t* data, std::size_t size)
    {
        std::FILE* f = std::fopen(path_.c_str(), "wb");
        if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
        return path_;
    }

private:
    std::filesystem::path path_;
};

} // namespace replica::fuzz
