#pragma once
// How new CUDA contexts choose and run their kernels: process-wide defaults, read when a context is
// made (default_options()). docs/guide.md lists them with their measured effect. Only under nvcc.

#include <iosfwd>
#include <string>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// How a convolution runs (not a transposed one, nor one that our direct kernels take: conv/direct.hpp).
enum class ConvPath {
    timed,           // per pass (forward; the two gradients), the faster of cuDNN and the products, timed per
                     // layer and batch size (conv/autotune.hpp); needs Options::benchmark, else cudnn
    cudnn,           // cuDNN's algorithms
    gemm,            // as products over its windows: im2row, then a fully connected layer over every output pixel
    gemm_forward,    // the forward pass as products, the gradients by cuDNN (for measurements and tests)
    gemm_backward,   // the forward pass by cuDNN, the gradients as products (likewise)
};

struct Options {
    // TF32 tensor cores for convolutions (PyTorch's default), their products too (ConvPath::gemm);
    // never for fully connected layers.
    bool allow_tf32 = true;
    // Only deterministic cuDNN algorithms, and cuDNN's and cuBLASLt's own heuristic choices: the same
    // in every context and every run (benchmark is then not used).
    bool deterministic = false;
    // Choose each convolution's algorithms and each fully connected layer's products by timing the
    // candidates of cuDNN's and cuBLASLt's heuristics as a step runs them (timing.hpp), once per shape
    // and kind of GPU in the process. A new shape's first step takes longer (every candidate is
    // timed, and with ConvPath::timed the product path too), unless the tuning cache has them.
    bool benchmark = true;
    // Keep the timed choices (benchmark) on disk as well, and take them from there in a later run
    // instead of timing again (tuning.hpp; the file: core/tuning_cache.hpp). A record is taken only
    // where the GPU's kind, the driver, the CUDA runtime, cuDNN, cuBLASLt and replica are those it was
    // timed with, and its algorithms are among the libraries' candidates now; a file that is not whole
    // is ignored with one line to `log` (std::cerr where that is null). Not read in deterministic mode.
    bool tuning_cache = true;
    // The tuning cache's folder. Empty: $REPLICA_CACHE_DIR, else $XDG_CACHE_HOME/replica, else
    // $HOME/.cache/replica (none of them set: no cache).
    std::string tuning_cache_dir;
    // Capture a model's training step (forward, loss and backward) in CUDA graphs once per batch
    // size and staging buffer and replay them, so that a step costs a few launches on the host. A
    // DataParallel replica's step is captured in segments, cut where a gradient bucket is complete:
    // its all-reduce is queued between two segments, eagerly, so it overlaps the rest of backward and
    // no CUDA graph holds a collective. A nested DataParallel runs eagerly; the reproducible mode
    // replays its micro-shards.
    bool graphs = true;
    // How convolutions run (ConvPath). `timed` compares, once per shape and kind of GPU, the product
    // path's forward with cuDNN's timed forward algorithm and its backward with cuDNN's two timed
    // gradient algorithms, and keeps cuDNN for a pass unless the products are 3% faster. Deterministic
    // mode with `timed`: cuDNN.
    ConvPath conv_path = ConvPath::timed;
    // Activations of 16-bit types (bf16, fp16) channels-last: a sample's values as (pixels, channels),
    // where cuDNN's tensor-core convolutions read and write them without layout transforms
    // (layout.hpp). Float activations are always (channels, pixels), as on the CPU. Parameters,
    // checkpoints, a model's inputs and predict's outputs are (channels, pixels) either way.
    bool channels_last = true;
    // Where each timed choice is written, one line per shape and kind of GPU as it is made: for a
    // convolution, the layer, cuDNN's chosen algorithms and their times, the product path's times and
    // which passes take it (conv/autotune.hpp); for a cuBLASLt product (a fully connected layer's, or a
    // convolution's on the product path), every candidate's algorithm, tile and time and the one chosen
    // (linear.hpp). A choice taken from the tuning cache gets the line it got when it was timed, with
    // " (from the tuning cache)" at its end. nullptr: nowhere. `train_bench --log-choices` sets std::cerr.
    std::ostream* log = nullptr;
};

inline Options& default_options()
{
    static Options o;
    return o;
}

} // namespace replica::backend::cuda
