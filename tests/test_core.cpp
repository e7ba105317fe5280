// core: shapes, devices, the counter-based generator, buffers.

#include <set>
#include <thread>

#include "catch.hpp"
#include "replica/replica.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_core {

using namespace replica;

static_assert(Shape<1, 28, 28>::rank == 3 && Shape<1, 28, 28>::size == 784);
static_assert(Shape<69, 1014>::dim<1> == 1014);
static_assert(ShapeType<Shape<3>> && !ShapeType<int>);

TEST_CASE("Devices parse and print", "[cpu]")
{
    CHECK(Device::parse("cpu:3") == Device::cpu(3));
    CHECK(Device::parse("cpu") == Device::cpu(0));
    CHECK(Device::parse("cuda:1") == Device::cuda(1));
    CHECK(Device::cuda(2).name() == "cuda:2");
    const auto list = parse_devices("cpu:0,cpu:1,cpu:2");
    REQUIRE(list.size() == 3);
    CHECK(list[2] == Device::cpu(2));
    CHECK_THROWS_AS(parse_devices(""), Error);
    CHECK_THROWS_AS(Device::parse("tpu:0"), Error);
    CHECK_THROWS_AS(Device::parse("cpu:-1"), Error);
}

TEST_CASE("Philox4x32-10 matches the published known-answer vectors", "[cpu]")
{
    // Random123's kat_vectors for philox4x32_10.
    auto r = core::philox4x32({0, 0, 0, 0}, {0, 0});
    CHECK(r == std::array<std::uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
    r = core::philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
    CHECK(r == std::array<std::uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    r = core::philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
    CHECK(r == std::array<std::uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("Random streams depend on (seed, stream, layer, item, element) only", "[cpu]")
{
    using core::Stream;
    const float a = core::random_uniform(1, Stream::dropout, 3, 1000, 7);
    CHECK(a == core::random_uniform(1, Stream::dropout, 3, 1000, 7));
    CHECK(a != core::random_uniform(2, Stream::dropout, 3, 1000, 7));
    CHECK(a != core::random_uniform(1, Stream::init, 3, 1000, 7));
    CHECK(a != core::random_uniform(1, Stream::dropout, 4, 1000, 7));
    CHECK(a != core::random_uniform(1, Stream::dropout, 3, 1001, 7));
    CHECK(a != core::random_uniform(1, Stream::dropout, 3, 1000, 8));
    // Uniform on [0, 1): mean and variance of many draws.
    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double u = core::random_uniform(9, Stream::init, 0, 0, std::uint32_t(i));
        REQUIRE(u >= 0.0);
        REQUIRE(u < 1.0);
        sum += u;
        sq += u * u;
    }
    CHECK(std::abs(sum / n - 0.5) < 0.005);
    CHECK(std::abs(sq / n - sum / n * sum / n - 1.0 / 12) < 0.002);
}

TEST_CASE("Buffers are aligned, zeroed and move-only", "[cpu]")
{
    auto b = core::Buffer<float>::host(1000);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
    CHECK(b.size() == 1000);
    for (float x : b.span()) REQUIRE(x == 0.0f);
    b[3] = 2.0f;
    auto c = std::move(b);
    CHECK(c[3] == 2.0f);
    CHECK(b.empty());
    static_assert(!std::is_copy_constructible_v<core::Buffer<float>>);
}

TEST_CASE("The worker pool runs every worker per phase and carries exceptions", "[cpu]")
{
    parallel::WorkerPool pool(3);
    std::vector<int> hits(3, 0);
    for (int phase = 0; phase < 100; ++phase) pool.run([&](std::size_t i) { ++hits[i]; });
    CHECK(hits == std::vector<int>{100, 100, 100});
    CHECK_THROWS_AS(pool.run([](std::size_t i) { if (i == 1) throw Error("boom"); }), Error);
    pool.run([&](std::size_t i) { ++hits[i]; });   // still usable
    CHECK(hits[2] == 101);
    for (int phase = 0; phase < 3; ++phase) {   // after the workers stopped polling and sleep
        std::this_thread::sleep_for(parallel::WorkerPool::poll_for * 5);
        pool.run([&](std::size_t i) { ++hits[i]; });
    }
    CHECK(hits == std::vector<int>{104, 104, 104});
}

TEST_CASE("The host communicator sums in rank order, grouped or threaded, bit for bit", "[cpu]")
{
    const std::size_t ranks = 3, count = 1001;
    auto fill = [&](std::vector<std::vector<float>>& b) {
        b.assign(ranks, std::vector<float>(count));
        for (std::size_t r = 0; r < ranks; ++r)
            for (std::size_t i = 0; i < count; ++i)
                b[r][i] = core::random_uniform(r, core::Stream::synthetic, 0, 0, std::uint32_t(i)) * 1e3f - 500.0f;
    };
    std::vector<std::vector<float>> grouped, threaded;
    fill(grouped);
    fill(threaded);
    std::vector<float> expected(count);
    for (std::size_t i = 0; i < count; ++i) expected[i] = (grouped[0][i] + grouped[1][i]) + grouped[2][i];

    parallel::HostCommunicator comm(ranks);
    std::vector<float*> ptrs{grouped[0].data(), grouped[1].data(), grouped[2].data()};
    comm.group_all_reduce(ptrs, count, 0);
    parallel::WorkerPool pool(ranks);
    pool.run([&](std::size_t r) { comm.all_reduce(r, threaded[r].data(), count, 0); });
    for (std::size_t r = 0; r < ranks; ++r) {
        CHECK(grouped[r] == expected);
        CHECK(threaded[r] == expected);
    }
}

TEST_CASE("A failing replica releases the others from the all-reduce", "[cpu]")
{
    parallel::HostCommunicator comm(2);
    parallel::WorkerPool pool(2);
    std::vector<float> buf(4, 1.0f);
    CHECK_THROWS_AS(pool.run([&](std::size_t r) {
                        if (r == 0) {
                            comm.abort();
                            throw Error("replica 0 failed");
                        }
                        comm.all_reduce(r, buf.data(), buf.size(), 0);
                    }),
                    Error);
}

} // namespace test_core
