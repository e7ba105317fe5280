// Trains each standard network a few steps on the CPU (fixed data) and prints an FNV-1a hash of its
// parameters, statistics and optimizer state: built against two commits, the lines are equal when a
// change keeps every bit of training (a restructuring). Not part of the build (it instantiates every
// standard network); from the repository root, for each commit's checkout at DIR:
//
//   g++ -std=c++20 -O1 -I DIR/include bench/param_hash.cpp -lopenblas -lpthread -lz -o /tmp/param_hash
//   /tmp/param_hash > /tmp/hashes-COMMIT.txt
#include <cstdio>
#include <cstring>
#include <vector>
#include "replica/replica.hpp"
using namespace replica;

static std::uint64_t fnv(const std::vector<float>& v, std::uint64_t h = 1469598103934665603ull)
{
    for (float f : v) { std::uint32_t b; std::memcpy(&b, &f, 4); for (int i = 0; i < 4; ++i) { h ^= (b >> (8 * i)) & 0xff; h *= 1099511628211ull; } }
    return h;
}
template <class M, class Opt>
void run(const char* name, std::size_t batch, int steps, Opt opt, std::vector<Device> devices = {Device::cpu()})
{
    using E = typename model::replica_of<M>::type::input_element;
    constexpr std::size_t in = M::input_shape::size, ls = M::label_size;
    std::vector<E> x(batch * in);
    std::vector<std::int32_t> y(batch * ls);
    for (std::size_t i = 0; i < x.size(); ++i) {
        if constexpr (std::is_same_v<E, float>) x[i] = float((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        else x[i] = std::int32_t((i * 2654435761u) % model::replica_of<M>::type::vocabulary);
    }
    const std::size_t classes = M::loss::template classes<typename M::output_shape>;
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t((i * 40503u) % classes);
    M m = [&] { if constexpr (parallel::is_data_parallel<M>::value) return M{devices, 3}; else return M{devices.front(), 3}; }();
    double loss = 0;
    for (int s = 0; s < steps; ++s) {
        data::BatchOf<E> b{x.data(), y.data(), batch, std::uint64_t(s) * batch, 11};
        loss = train_step(m, opt, b);
    }
    std::uint64_t h = fnv(m.parameters());
    h = fnv(m.statistics(), h);
    h = fnv(m.optimizer_state(), h);
    std::printf("%-12s loss %.9g hash %016llx\n", name, loss, (unsigned long long)h);
}
int main()
{
    run<LeNet>("lenet", 16, 3, SGD{{.lr = 0.05f, .momentum = 0.9f}});
    run<DataParallel<LeNet, Threaded>>("lenet-dp2", 16, 3, SGD{{.lr = 0.05f, .momentum = 0.9f}}, {Device::cpu(0), Device::cpu(1)});
    run<AlexNetPlain>("alexnet", 2, 2, SGD{{.lr = 0.01f, .momentum = 0.9f}});
    run<AlexNet>("alexnet-nest", 2, 2, SGD{{.lr = 0.01f, .momentum = 0.9f}});
    run<GoogLeNet>("googlenet", 2, 2, SGD{{.lr = 0.01f, .momentum = 0.9f}});
    run<TextCNN>("textcnn", 8, 3, Adam{{.lr = 0.001f}});
    run<FCN>("fcn", 1, 2, SGD{{.lr = 0.01f, .momentum = 0.9f}});
    run<ResNet20>("resnet20", 8, 3, SGD{{.lr = 0.05f, .momentum = 0.9f}});
    run<ResNet18>("resnet18", 2, 2, AdamW{{.lr = 0.001f}});
    run<ResNet50>("resnet50", 2, 2, SGD{{.lr = 0.01f, .momentum = 0.9f}});
    run<with_precision<ResNet20, bf16>>("resnet20-bf16", 8, 3, SGD{{.lr = 0.05f, .momentum = 0.9f}});
    run<CharGPT>("chargpt", 4, 3, ClipGradNorm{AdamW{{.lr = 0.002f}}, 1.0f});
    run<with_precision<CharGPT, bf16>>("chargpt-bf16", 4, 2, AdamW{{.lr = 0.002f}});
}
