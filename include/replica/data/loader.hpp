#pragma once
// Loader: a Dataset in batches, in an order that is a pure function of (seed, epoch), with the next
// batch gathered on a background thread while the caller trains on this one.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/checked.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/source.hpp"
#include "replica/parallel/scaling.hpp"

namespace REPLICA_NAMESPACE::data {

// Fills `order` with the permutation of [0, order.size()) that epoch `epoch` visits under `seed`:
// a Fisher-Yates shuffle whose step i draws random_bits(seed, Stream::shuffle, 0, epoch, i).
// Needs order.size() <= 2^32.
inline void epoch_order(std::uint64_t seed, std::uint64_t epoch, std::span<std::size_t> order)
{
    core::require(order.size() <= (std::uint64_t{1} << 32), "epoch_order: at most 2^32 samples, not " +
                                                                std::to_string(order.size()));
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t i = order.size(); i-- > 1;) {
        std::uint64_t bits = core::random_bits(seed, core::Stream::shuffle, 0, epoch, std::uint32_t(i));
        std::size_t j = std::size_t((bits * (i + 1)) >> 32); // uniform in [0, i]
        std::swap(order[i], order[j]);
    }
}

// Usage: for each epoch, start_epoch(epoch), then next() until it returns nullopt.
//
// Batch k of epoch e holds samples order[k * batch_size, ...) of epoch_order(seed, e) (or 0, 1, ...
// without shuffle); its first_sample is e * set.count + k * batch_size and its seed the loader's.
// The Batch returned by next() stays valid until the second next() after it, start_epoch() or the
// destructor: a caller holds two batches (this step's, and the next one to copy to the GPUs ahead)
// while the loader gathers a third. The last batch of an epoch holds the remaining samples, or is left out with drop_last.
// `set` must outlive the loader and stay unchanged. One thread calls the loader at a time.
// A SampleSource (files decoded and augmented on demand) is read on the background thread, sample by
// sample, with the epoch of the batch: set.read(sample, e, ...); with set.threads > 1, by that many
// threads at once, started for each batch. The constructor refuses (Error) a batch larger than the
// data set; a Dataset's sizes and finiteness are checked once, when it becomes a source (source.hpp).
//
// Several processes: only(part) makes the loader gather, of each batch of n samples, only samples
// [offset, offset + count) = part(n), at their places in the batch; the rest of the batch is not
// written. A DataParallel spanning processes reads exactly its process's part (process_share).
// E: the inputs' element, float or std::int32_t token ids (LoaderOf<std::int32_t>, from a
// TokenDataset or TokenSampleSource); Loader is LoaderOf<float>.
template <class E>
class LoaderOf {
public:
    LoaderOf(SampleSourceOf<E> set, std::size_t batch_size, std::uint64_t seed, bool shuffle = true,
           bool drop_last = false)
        : set_(std::move(set)), batch_size_(batch_size), seed_(seed), shuffle_(shuffle)
    {
        core::require(batch_size > 0, "Loader needs a batch size > 0");
        core::require(set_.count > 0, "Loader needs a data set with samples; this one is empty");
        core::require(bool(set_.read), "Loader: the sample source has no read function");
        core::require(set_.count <= (std::uint64_t{1} << 32), "Loader: at most 2^32 samples, not " +
                                                                 std::to_string(set_.count));
        core::require(batch_size <= set_.count,
                      "Loader: batch size " + std::to_string(batch_size) + " is larger than the data set's " +
                          std::to_string(set_.count) + " samples, so no batch could be full: use a batch size of at most " +
                          std::to_string(set_.count));
        batches_ = drop_last ? set_.count / batch_size : (set_.count + batch_size - 1) / batch_size;
        order_.resize(set_.count);
        for (Slot& slot : slots_) {
            slot.inputs = backend::host_buffer<E>(core::checked_mul(batch_size, set_.input_size, "Loader: batch x input size"));
            slot.labels = backend::host_buffer<std::int32_t>(core::checked_mul(batch_size, set_.label_size, "Loader: batch x label size"));
        }
        worker_ = std::thread([this] { work(); });
    }

    ~LoaderOf()
    {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_one();
        worker_.join();
    }

    LoaderOf(const LoaderOf&) = delete;
    LoaderOf& operator=(const LoaderOf&) = delete;

    // Gather only part(n) = {offset, count} of each n-sample batch (see above). Call before start_epoch.
    void only(std::function<parallel::Share(std::size_t)> part)
    {
        wait_idle();
        part_ = std::move(part);
    }

    std::size_t batches_per_epoch() const { return batches_; }
    std::size_t batch_size() const { return batch_size_; }

    // Starts epoch `epoch` (any order of epochs; an unfinished epoch is abandoned) and begins
    // gathering its first batch.
    void start_epoch(std::uint64_t epoch)
    {
        wait_idle(); // a batch gathered for the abandoned epoch, and any error it raised, are dropped
        epoch_ = epoch;
        next_batch_ = 0;
        started_ = true;
        if (shuffle_) {
            epoch_order(seed_, epoch, order_);
        } else {
            std::iota(order_.begin(), order_.end(), std::size_t{0});
        }
        request(0);
    }

    // The next batch of the epoch, or nullopt after its last. Rethrows an exception raised while
    // gathering the batch; calling next() again retries it.
    std::optional<BatchOf<E>> next()
    {
        core::require(started_, "Loader::next() called before start_epoch(): call start_epoch(epoch) first");
        if (next_batch_ >= batches_) return std::nullopt;
        std::size_t k = next_batch_;
        if (std::exception_ptr error = wait_idle()) {
            request(k);
            std::rethrow_exception(error);
        }
        ++next_batch_;
        // Its slot held the batch returned two calls ago: the caller is done with that one.
        if (next_batch_ < batches_) request(next_batch_);
        const Slot& slot = slots_[k % kSlots];
        return BatchOf<E>{slot.inputs.data(), slot.labels.data(), batch_samples(k),
                     epoch_ * set_.count + k * batch_size_, seed_};
    }

private:
    struct Slot {
        core::Buffer<E> inputs;          // (batch_size, input_size), pinned under CUDA
        core::Buffer<std::int32_t> labels;   // (batch_size, label_size)
    };

    std::size_t batch_samples(std::size_t k) const { return std::min(batch_size_, set_.count - k * batch_size_); }

    // Waits until no batch is being gathered; returns (and clears) the error the last one raised.
    std::exception_ptr wait_idle()
    {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [this] { return !pending_; });
        return std::exchange(error_, nullptr);
    }

    // Asks the worker to gather batch k into slot k % kSlots. Only when idle.
    void request(std::size_t k)
    {
        {
            std::lock_guard lock(mutex_);
            job_ = k;
            pending_ = true;
        }
        wake_.notify_one();
    }

    void gather(std::size_t k)
    {
        Slot& slot = slots_[k % kSlots];
        const std::size_t in = set_.input_size, out = set_.label_size;
        const std::size_t* samples = order_.data() + k * batch_size_;
        const std::size_t n = batch_samples(k);
        const parallel::Share part = part_ ? part_(n) : parallel::Share{0, n};
        core::require(part.offset + part.count <= n, "Loader::only: the part lies outside the batch");
        auto read = [&](std::size_t first, std::size_t step) {
            for (std::size_t i = part.offset + first; i < part.offset + part.count; i += step)
                set_.read(samples[i], epoch_, slot.inputs.data() + i * in, slot.labels.data() + i * out);
        };
        // A source that allows it (decoding files) is read by several threads, each every t-th sample.
        const std::size_t threads = std::min(set_.threads, part.count);
        if (threads <= 1) return read(0, 1);
        std::vector<std::exception_ptr> errors(threads);
        std::vector<std::thread> helpers;
        for (std::size_t t = 1; t < threads; ++t)
            helpers.emplace_back([&, t] {
                try {
                    read(t, threads);
                } catch (...) {
                    errors[t] = std::current_exception();
                }
            });
        try {
            read(0, threads);
        } catch (...) {
            errors[0] = std::current_exception();
        }
        for (std::thread& h : helpers) h.join();
        for (const std::exception_ptr& e : errors)
            if (e) std::rethrow_exception(e);
    }

    void work()
    {
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_.wait(lock, [this] { return stop_ || pending_; });
            if (stop_) return;
            const std::size_t k = job_;
            lock.unlock();
            std::exception_ptr error;
            try {
                gather(k);
            } catch (...) {
                error = std::current_exception();
            }
            lock.lock();
            error_ = error;
            pending_ = false;
            done_.notify_one();
        }
    }

    SampleSourceOf<E> set_;
    std::size_t batch_size_;
    std::uint64_t seed_;
    bool shuffle_;
    std::size_t batches_ = 0;
    std::vector<std::size_t> order_; // this epoch's samples in visiting order; written only while idle
    static constexpr std::size_t kSlots = 3;
    Slot slots_[kSlots];             // batch k is gathered into slots_[k % kSlots]
    std::function<parallel::Share(std::size_t)> part_;   // only(): written only while idle

    std::uint64_t epoch_ = 0;        // the worker reads it; written only while idle
    // Caller thread only.
    std::size_t next_batch_ = 0;
    bool started_ = false;

    // Shared with the worker, under mutex_.
    std::mutex mutex_;
    std::condition_variable wake_; // a job or stop for the worker
    std::condition_variable done_; // the job is done
    std::size_t job_ = 0;
    bool pending_ = false;
    bool stop_ = false;
    std::exception_ptr error_;

    std::thread worker_;
};

using Loader = LoaderOf<float>;
using TokenLoader = LoaderOf<std::int32_t>;

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::epoch_order;
using data::Loader;
using data::LoaderOf;
using data::TokenLoader;
} // namespace replica
