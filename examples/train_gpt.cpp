// A character-level GPT (models::CharGPT: 4 blocks of 4 heads, width 128, context 64, the 256 byte
// values as its vocabulary, the head tied to the token embedding) trained on plain text, byte by byte,
// with auto_parallel on every GPU or the CPU's cores; then it writes text.
//
//   train_gpt                                   # the fortunes of Debian's `fortunes` package
//   train_gpt --text book.txt --steps 2000      # your own text (several files are read in order)
//   train_gpt --prompt "The " --temperature 0.8 --top-k 40 --sample-length 500
//   train_gpt --devices cpu:0 --json            # one line of JSON at the end (bench/gpt_cpu.py)
//
// Training windows are 65 bytes at random offsets of the training part, keyed on (seed, epoch, sample)
// so that they do not depend on the device count; the last --validation fraction of the text is held
// out and cut into consecutive windows. Every --eval-every steps (an "epoch" of the Trainer) it prints
// the training loss and the validation loss, in nats and in bits per character, and at the end samples
// text from --prompt. AdamW (weight decay on matrices and embeddings, not on biases and LayerNorm),
// gradients clipped to norm 1, a linear warm-up and cosine decay to a tenth of the rate.
//
// Exit status: 0 trained, 1 refused or failed (the message says why), 2 a bad command line.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support/cli.hpp"

using namespace replica;

namespace {

struct Settings {
    std::vector<std::string> text;
    std::size_t steps = 2000, batch_size = 32, eval_every = 250, warmup = 100, sample_length = 400, top_k = 0;
    float lr = 2e-3f, weight_decay = 0.1f, temperature = 0.8f, validation = 0.05f;
    std::uint64_t seed = 1;
    std::string prompt = "\n", checkpoint;
    bool resume = false, json = false;
    examples::DeviceFlags dev;
    examples::MemoryFlag memory;
};

// The plain-text fortunes (not their .dat indexes nor the .u8 links), in name order.
std::vector<std::string> fortunes()
{
    const std::filesystem::path dir = "/usr/share/games/fortunes";
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string ext = entry.path().extension().string();
        if (entry.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(entry.path().string());
    }
    if (files.empty())
        throw Error("no text given and no fortunes in " + dir.string() +
                    ": install Debian's fortunes package (scripts/demo --model gpt does), or pass --text FILE");
    std::sort(files.begin(), files.end());
    return files;
}

// The sample as text with its line breaks; other control bytes and bytes above 126 shown as '.'.
std::string readable(const std::string& s)
{
    std::string out = s;
    for (char& c : out) {
        const auto b = static_cast<unsigned char>(c);
        if (c != '\n' && c != '\t' && (b < 32 || b > 126)) c = '.';
    }
    return out;
}

int run(Settings& s)
{
    using Net = CharGPT;
    constexpr std::size_t T = Net::input_shape::size;
    if (s.text.empty()) s.text = fortunes();
    const TokenFile text = TokenFile::from_files(std::vector<std::filesystem::path>(s.text.begin(), s.text.end()),
                                                 {.validation = double(s.validation)});
    const auto devices = s.dev.device_list(all_devices());
    auto model = auto_parallel(Net{devices, s.seed}, devices,
                               {.dispatch = s.dev.dispatch_choice(),
                                .batch_size = s.batch_size,
                                .memory_budget = s.memory.bytes(),
                                .state_per_param = 2});   // AdamW's m and v
    ClipGradNorm opt{AdamW{{.lr = s.lr, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = s.weight_decay}}, 1.0f};
    const std::size_t epochs = (s.steps + s.eval_every - 1) / s.eval_every;
    const double warmup = double(s.warmup) / double(s.eval_every);
    Schedule schedule = Schedule::cosine(double(epochs), double(s.lr) / 10.0);
    if (warmup > 0.0) schedule = schedule.with_warmup(warmup);
    Trainer trainer{model, opt,
                    {.batch_size = s.batch_size,
                     .epochs = epochs,
                     .validate_every = 1,
                     .seed = s.seed,
                     .checkpoint = s.checkpoint,
                     .resume = s.resume,
                     .schedule = schedule,
                     .progress = !s.json,
                     .log = s.json ? nullptr : &std::cout}};
    const auto train_set = text.train(T, s.eval_every * s.batch_size, s.seed);
    const TokenDataset validation = text.validation(T);
    if (!s.json)
        std::printf("CharGPT (%zu parameters) on %s; %zu training bytes, %zu validation windows of %zu; batch %zu, "
                    "%zu steps, AdamW lr %g (warm-up %zu steps, cosine to %g), weight decay %g, clipping at 1\n",
                    Net::param_count, model.description().c_str(), text.train_size(), validation.count, T,
                    s.batch_size, epochs * s.eval_every, double(s.lr), s.warmup, double(s.lr) / 10.0,
                    double(s.weight_decay));
    const auto start = std::chrono::steady_clock::now();
    const History history = trainer.fit(train_set, validation);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const std::vector<std::int32_t> prompt = TokenFile::encode(s.prompt);
    const std::vector<std::int32_t> ids =
        generate(model, prompt, s.sample_length, {.temperature = s.temperature, .top_k = s.top_k, .seed = s.seed});
    const std::string sample = readable(TokenFile::decode(ids));
    const double last = history.epochs.back().validation_loss;
    if (s.json) {
        std::printf("{\"framework\": \"replica\", \"steps\": %zu, \"batch\": %zu, \"devices\": \"%s\", \"train_bytes\": %zu, "
                    "\"val_windows\": %zu, \"seconds\": %.3f, \"val_loss\": %.6f, \"record\": [",
                    epochs * s.eval_every, s.batch_size, model.description().c_str(), text.train_size(), validation.count,
                    seconds, last);
        for (std::size_t i = 0; i < history.epochs.size(); ++i) {
            const EpochRecord& r = history.epochs[i];
            std::printf("%s{\"step\": %zu, \"train_loss\": %.6f, \"val_loss\": %.6f, \"seconds\": %.3f}", i ? ", " : "",
                        std::size_t(r.epoch) * s.eval_every, r.train_loss, r.validation_loss, r.seconds);
        }
        std::printf("]}\n");
        return 0;
    }
    std::printf("\nstep  train (nats)  validation (nats)  (bits per character)\n");
    for (const EpochRecord& r : history.epochs)
        std::printf("%5zu  %12.4f  %17.4f  %9.3f\n", std::size_t(r.epoch) * s.eval_every, r.train_loss,
                    r.validation_loss, r.validation_loss / std::log(2.0));
    std::printf("trained in %.1f s; validation loss %.4f nats (%.3f bits) per character\n\nsample (temperature %g%s):\n%s\n",
                seconds, last, last / std::log(2.0), double(s.temperature),
                s.top_k ? (", top " + std::to_string(s.top_k)).c_str() : "", sample.c_str());
    return 0;
}

} // namespace

int main(int argc, char** argv)
try {
    Settings s;
    CLI::App app{"train a character-level GPT on plain text and sample from it", "train_gpt"};
    app.add_option("--text", s.text, "text files, read in order (default: the fortunes of Debian's fortunes package)")
        ->check(CLI::ExistingFile);
    examples::count_option(app, "--steps", s.steps, "training steps (rounded up to a multiple of --eval-every)", 1, 100000000);
    examples::count_option(app, "--batch-size", s.batch_size, "windows a step, over every device", 1, 1000000);
    examples::count_option(app, "--eval-every", s.eval_every, "steps between validations (the Trainer's epoch)", 1, 100000000);
    examples::count_option(app, "--warmup", s.warmup, "steps of linear warm-up (0: none)", 0, 100000000);
    examples::real_option(app, "--lr", s.lr, "peak learning rate", 1e-7, 1.0);
    examples::real_option(app, "--weight-decay", s.weight_decay, "AdamW's decoupled weight decay", 0.0, 1.0);
    examples::real_option(app, "--validation", s.validation, "fraction of the text held out, at its end", 0.001, 0.5);
    examples::count_option(app, "--seed", s.seed, "seed for initialisation, windows and sampling", 0,
                           std::numeric_limits<std::uint64_t>::max());
    app.add_option("--prompt", s.prompt, "text the sample starts from")->check(examples::not_empty);
    examples::count_option(app, "--sample-length", s.sample_length, "bytes to write after the prompt", 0, 1000000);
    examples::real_option(app, "--temperature", s.temperature, "sampling temperature", 1e-3, 100.0);
    examples::count_option(app, "--top-k", s.top_k, "sample among the k likeliest bytes (0: all 256)", 0, 256);
    app.add_option("--checkpoint", s.checkpoint, "checkpoint file, written at every validation")->check(examples::not_empty);
    app.add_flag("--resume", s.resume, "continue from --checkpoint if it exists")->needs("--checkpoint");
    app.add_flag("--json", s.json, "print one JSON object at the end instead of the log");
    s.dev.add(app, "all (every GPU, or one CPU replica per hardware thread)", {"auto", "single", "threaded"});
    s.memory.add(app);
    if (int code = examples::parse(app, argc, argv)) return code - 1;
    return run(s);
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
