// libFuzzer target: read_idx on arbitrary bytes (plain IDX, and gzip streams from the corpus).
// Every input must either read or throw replica::Error; a crash, a sanitizer report, a hang or an
// allocation beyond -rss_limit_mb is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_file.hpp"
#include "replica/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    static replica::fuzz::ScratchFile file(".idx");
    try {
        const replica::IdxArray a = replica::read_idx(file.write(data, size));
        std::size_t total = 1;
        for (std::size_t d : a.dims) total *= d;
        if (a.dims.empty() || total != a.bytes.size()) std::abort();   // read must keep its contract
    } catch (const replica::Error&) {
    }
    return 0;
}
