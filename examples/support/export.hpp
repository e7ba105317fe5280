#pragma once
// --export FILE: the trained model written as ONNX (replica/onnx/export.hpp), and beside it
// FILE.reference: the first samples of a data set and the model's predict() outputs for them, which
// tests/onnx/compare.py FILE checks against ONNX Runtime.
//
//   examples::ExportFlag exporter;  exporter.add(app);
//   ... parse, then exporter.prepare() before the model is made ...
//   exporter.write(model, test_set);   // after training, in the process of rank 0
//
// Programs built without the ONNX part (REPLICA_EXAMPLES_ONNX undefined: Meson found no libonnx-dev)
// refuse --export on the command line, before anything runs.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "replica/backend/backend.hpp"
#include "replica/core/error.hpp"
#include "replica/data/dataset.hpp"
#include "support/cli.hpp"
#if defined(REPLICA_CUDA)
#include "replica/backend/cuda/options.hpp"
#endif
#if REPLICA_EXAMPLES_ONNX
#include "replica/onnx/export.hpp"
#endif

namespace replica::examples {

#if REPLICA_EXAMPLES_ONNX
inline constexpr bool onnx_built = true;
#else
inline constexpr bool onnx_built = false;
#endif

struct ExportFlag {
    std::string path;
    std::size_t reference_samples = 8;

    void add(CLI::App& app)
    {
        app.add_option("--export", path,
                       "after training, write the model as ONNX to this file (opset 17) and FILE.reference "
                       "(test inputs and predict()'s outputs; tests/onnx/compare.py FILE checks them); on GPUs "
                       "the convolutions then run without TF32, as an ONNX runtime computes")
            ->check(not_empty)
            ->check(CLI::Validator(
                [](std::string&) -> std::string {
                    return onnx_built ? "" : "this program was built without ONNX export: install libonnx-dev and "
                                             "libprotobuf-dev, then reconfigure (meson setup --reconfigure, or "
                                             "-Donnx=enabled to make it required)";
                },
                "", "onnx_built"));
    }

    // Before the model is made: a file that cannot be written is refused now, not after the run; on
    // GPUs, convolutions run without TF32 (an ONNX runtime computes in FP32, and predict() is to match
    // it to 1e-5: tests/onnx/compare.py).
    void prepare() const
    {
        if (path.empty()) return;
        const auto folder = std::filesystem::absolute(path).parent_path();
        core::require(std::filesystem::is_directory(folder),
                      "--export " + path + ": the folder " + folder.string() + " does not exist: create it first");
#if defined(REPLICA_CUDA)
        backend::cuda::default_options().allow_tf32 = false;
#endif
    }

    template <class Model>
    void write(Model& model, const data::Dataset& samples) const
    {
        if (path.empty()) return;
#if REPLICA_EXAMPLES_ONNX
        const std::size_t n = std::min(reference_samples, samples.count);
        onnx::export_onnx(model, path);
        if (n == 0) {
            std::printf("exported %s (ONNX, opset %lld); no samples to write a reference with\n", path.c_str(),
                        static_cast<long long>(onnx::opset));
            return;
        }
        onnx::write_reference(model, samples.inputs.data(), n, path + ".reference");
        std::printf("exported %s (ONNX, opset %lld) and %s.reference (%zu samples); check it with "
                    "tests/onnx/compare.py %s\n",
                    path.c_str(), static_cast<long long>(onnx::opset), path.c_str(), n, path.c_str());
#else
        (void)model;
        (void)samples;
        throw Error("--export: this program was built without ONNX export");
#endif
    }
};

} // namespace replica::examples
