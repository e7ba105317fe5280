// libFuzzer target: read_idx on the fuzz input compressed with gzip, so that every input reaches the
// decompressing path with a valid stream (corrupt streams come through idx_plain's .gz seeds).

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_file.hpp"
#include "replica/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    static replica::fuzz::ScratchFile file(".idx.gz");
    // A gzip stream (windowBits 15 + 16) of the input.
    std::vector<std::uint8_t> packed(compressBound(uLong(size)) + 64);
    z_stream z{};
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
    z.next_in = const_cast<Bytef*>(data);
    z.avail_in = uInt(size);
    z.next_out = packed.data();
    z.avail_out = uInt(packed.size());
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
    packed.resize(z.total_out);
    deflateEnd(&z);
    try {
        const replica::IdxArray a = replica::read_idx(file.write(packed.data(), packed.size()));
        std::size_t total = 1;
        for (std::size_t d : a.dims) total *= d;
        if (a.dims.empty() || total != a.bytes.size()) std::abort();
    } catch (const replica::Error&) {
    }
    return 0;
}
