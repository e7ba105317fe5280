#pragma once
// The PyTorch reference values of tests/pytorch/*.txt (written by tests/pytorch/make_fixtures.py):
// records of "name count" followed by count numbers.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch.hpp"
#include "replica/replica.hpp"

namespace replica::testing {

inline std::map<std::string, std::vector<double>> read_fixture(const std::string& name)
{
    const std::string path = std::string(REPLICA_SOURCE_DIR) + "/tests/pytorch/" + name;
    std::ifstream in(path);
    INFO("fixture " << path);
    REQUIRE(in.good());
    std::map<std::string, std::vector<double>> records;
    std::string key;
    std::size_t count = 0;
    while (in >> key >> count) {
        std::vector<double>& v = records[key];
        v.resize(count);
        for (double& x : v) REQUIRE(bool(in >> x));
    }
    REQUIRE(!records.empty());
    return records;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// The largest |got - want|.
inline double max_error(const std::vector<float>& got, const std::vector<double>& want)
{
    REQUIRE(got.size() == want.size());
    double most = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) most = std::max(most, std::abs(double(got[i]) - want[i]));
    return most;
}

// max |got - want| / max |want| (a PyTorch fixture's scale); infinite where a value is not finite (a
// NaN left unwritten).
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want)
{
    REQUIRE(got.size() == want.size());
    double most = 0.0, error = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        most = std::max(most, std::abs(want[i]));
        error = std::max(error, std::abs(double(got[i]) - want[i]));
    }
    return error / most;
}

// The model of the Adam and AdamW fixtures (PyTorch's optimizers given net.parameters() decay every one).
using TorchNet = Sequential<ParamRule<DecayAll>, Input<8>, Linear<16>, GELU, Linear<12>, Tanh, Linear<10>, Sigmoid, Linear<4>>;

// The model of resnet.txt (make_fixtures.py, resnet_model()).
using TorchResNet = Sequential<
    ParamRule<DecayAll>,
    Input<2, 8, 8>, Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d, ReLU,
    Residual<Sequential<Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d, ReLU, Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d>>,
    ReLU,
    Residual<Sequential<Conv2d<6, 3, 2, 1, Bias::none>, BatchNorm2d, ReLU, Conv2d<6, 3, 1, 1, Bias::none>, BatchNorm2d>,
             Sequential<Conv2d<6, 1, 2, 0, Bias::none>, BatchNorm2d>>,
    ReLU, GlobalAvgPool, Linear<5>>;

// param_groups.txt's groups on TorchResNet: layers 0 and 1 (the first Conv2d and its BatchNorm)
// frozen, the Linear's weight at half the rate, weight decay on filters and weights only. Layer ids
// run depth first, composites none: the first block's layers are 3-7, the second's body 9-13 and
// shortcut 14-15, the Linear 18.
struct GroupRule {
    static constexpr std::uint32_t head = 18;
    static constexpr Treatment treat(ParamKind kind, std::uint32_t layer)
    {
        if (layer < 2) return {.frozen = true};
        if (layer == head && kind == ParamKind::weight) return {.lr_scale = 0.5f};
        return DecayWeights::treat(kind, layer);
    }
};
using GroupNet = with_param_rule<TorchResNet, GroupRule>;

// Sets the fixture's initial parameters and trains `net` on its inputs and labels with `opt`, in
// `steps` equal batches; returns the losses.
template <class M, class Opt>
std::vector<float> train_fixture_steps(M& net, Opt& opt, const std::map<std::string, std::vector<double>>& f,
                                       std::size_t steps)
{
    net.set_parameters(to_float(f.at("initial")));
    const std::vector<float> inputs = to_float(f.at("inputs"));
    std::vector<std::int32_t> labels;
    for (double l : f.at("labels")) labels.push_back(std::int32_t(l));
    const std::size_t batch = labels.size() / steps, size = M::input_shape::size;
    std::vector<float> losses;
    for (std::size_t s = 0; s < steps; ++s)
        losses.push_back(train_step(net, opt, Batch{inputs.data() + s * batch * size, labels.data() + s * batch, batch,
                                                    s * batch, 1}));
    return losses;
}

// Trains `net` param_groups.txt's 5 AdamW steps from its initial parameters; returns the losses.
template <class M>
std::vector<float> train_groups(M& net, const std::map<std::string, std::vector<double>>& f)
{
    AdamW opt{{.lr = float(f.at("hyper")[0]), .weight_decay = float(f.at("hyper")[1])}};
    return train_fixture_steps(net, opt, f, 5);
}

// Trains `net` from the resnet fixture's initial parameters for its 3 SGD steps (lr 0.1, momentum
// 0.9, weight decay 1e-3); returns the losses.
template <class M>
std::vector<float> train_resnet_fixture(M& net, const std::map<std::string, std::vector<double>>& f)
{
    SGD opt{{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f}};
    return train_fixture_steps(net, opt, f, 3);
}

// Sets the fixture's initial parameters and trains `net` its 5 steps with `opt`; returns the losses.
template <class M, class Opt>
std::vector<float> train_fixture(M& net, Opt& opt, const std::map<std::string, std::vector<double>>& f)
{
    return train_fixture_steps(net, opt, f, 5);
}

// The fixture's hyper-parameters: lr, beta1, beta2, eps, weight decay.
template <class Opt>
Opt fixture_optimizer(const std::vector<double>& h)
{
    return Opt{{.lr = float(h[0]), .beta1 = float(h[1]), .beta2 = float(h[2]), .eps = float(h[3]),
                .weight_decay = float(h[4])}};
}

// Tolerance against PyTorch after 5 steps of Adam: float rounding differs from PyTorch's (summation
// order in the GEMMs, libm) by about 1e-7 relative in each gradient; Adam divides m by sqrt(v), so a
// relative error of the gradient becomes about the same relative error of each step (steps of at
// most lr = 0.01), and the 5 steps add up. 2e-5 on parameters of magnitude <= 0.5 (and on losses
// of about 1.4) is a hundred times that, and 100 times smaller than one step: a wrong bias
// correction, a wrong weight decay or a step counted twice moves parameters by 1e-3 or more.
inline constexpr double kTorchTolerance = 2e-5;

} // namespace replica::testing
