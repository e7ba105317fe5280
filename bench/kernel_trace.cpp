// GPU time per kernel, copy and memset of any CUDA program, through CUPTI's Activity API. Built as
// build/bench/libreplica_kernel_trace.so; the CUDA driver loads it into a program when
// CUDA_INJECTION64_PATH names it (and calls InitializeInjection), so the same tool measures our
// benchmark and PyTorch alike. At exit it prints one report per process:
//
//   tool=$PWD/build/bench/libreplica_kernel_trace.so
//   CUDA_INJECTION64_PATH=$tool REPLICA_TRACE_LABEL=replica build/bench/train_bench_cuda --model googlenet --batch 128 --devices cuda:0
//   CUDA_INJECTION64_PATH=$tool REPLICA_TRACE_LABEL=pytorch python3 bench/pytorch_bench.py --model googlenet --batch 128
//
// Environment:
//   REPLICA_TRACE_START_MS  count only activities that start at least this many ms after the first GPU
//                           activity of the process (default 0), to leave out warm-up
//   REPLICA_TRACE_TOP       rows of the kernel table per device (default 40)
//   REPLICA_TRACE_OUT       file the report is appended to (default: stderr)
//   REPLICA_TRACE_LABEL     text shown in the report's header
//   REPLICA_TRACE_TIMELINE  file that also gets, at exit, every activity counted, one a line sorted by start:
//                           "device start_us end_us kind name", times in us after the first GPU activity,
//                           kind kernel, HtoD, DtoH, DtoD, PtoP, memset or other, name the demangled kernel
//                           name ("-" for the others); "%p" in it stands for the process id; header lines
//                           start with '#'; at most 2,000,000 activities are kept (the header says how
//                           many were left out). bench/timeline.py reads it.
//
// Report per device: kernel time and count, "GPU busy" (the union of kernel intervals: the rest of the
// window the device ran no kernel, e.g. waiting on the host), memcpy time and bytes by direction, memset
// time, and the kernels with the most GPU time. A CUPTI call that fails prints one line
// "replica kernel_trace: <call> failed: <reason>" and switches the tool off; the program runs on.

#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t buffer_bytes = 8u << 20;   // one activity buffer
constexpr std::size_t name_width = 110;   // kernel names are cut to this many characters

struct Totals {
    std::uint64_t ns = 0, count = 0, bytes = 0;
    void add(std::uint64_t t, std::uint64_t b = 0)
    {
        ns += t;
        ++count;
        bytes += b;
    }
};

enum Direction { htod, dtoh, dtod, ptop, other, directions };
constexpr const char* direction_names[directions] = {"HtoD", "DtoH", "DtoD", "PtoP", "other"};

// One activity of the timeline (REPLICA_TRACE_TIMELINE): 24 bytes, and no allocation per record.
constexpr std::size_t timeline_limit = 2'000'000;   // activities kept; the rest are counted
constexpr std::uint8_t kernel_kind = directions, memset_kind = directions + 1;   // a copy's kind: its Direction
constexpr std::uint32_t no_name = UINT32_MAX;
struct Event {
    std::uint64_t start = 0, end = 0;
    std::uint32_t name = no_name;   // a kernel's index into State::names
    std::uint16_t device = 0;   // CUPTI's device ids are small ordinals
    std::uint8_t kind = other;
};
static_assert(sizeof(Event) == 24);

// Looks kernel names up by string_view, so that a record costs no allocation once its kernel is known.
struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

using Interval = std::pair<std::uint64_t, std::uint64_t>;

struct DeviceStats {
    std::unordered_map<std::string, Totals, NameHash, std::equal_to<>> kernels;   // by mangled name
    Totals kernel, memset, copies[directions];
    std::vector<Interval> busy;   // kernel intervals; merged whenever it outgrows busy_limit
    std::size_t busy_limit = 1u << 20;
};

struct State {
    std::mutex mutex;   // guards everything below; CUPTI delivers buffers on its own thread
    std::atomic<bool> enabled{false};
    pid_t pid = 0;
    double start_ms = 0;
    std::size_t top = 40;
    std::string out, label;
    bool have_origin = false;
    std::uint64_t origin = 0;   // the first GPU activity (CUPTI timestamps, ns)
    std::uint64_t window_start = 0;   // origin + start_ms
    std::uint64_t first = UINT64_MAX, last = 0;   // the window: first start and last end counted
    std::uint64_t before_window = 0, incomplete = 0, dropped = 0;
    std::map<std::uint32_t, DeviceStats> devices;
    std::string timeline;   // REPLICA_TRACE_TIMELINE; empty: no timeline is kept
    std::vector<Event> events;
    std::uint64_t left_out = 0;   // activities past timeline_limit
    // The kernel names of the timeline, interned: index by mangled name, and name by index (the map's
    // keys, which stay where they are as it grows).
    std::unordered_map<std::string, std::uint32_t, NameHash, std::equal_to<>> name_index;
    std::vector<const std::string*> names;
};

// Never destroyed: CUPTI may still deliver a buffer while the process exits.
State& state()
{
    static State* s = new State;
    return *s;
}

void disable()
{
    state().enabled = false;
    for (auto kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY2,
                      CUPTI_ACTIVITY_KIND_MEMSET})
        cuptiActivityDisable(kind);   // best effort; a kind that was never enabled fails harmlessly
}

// True when the call succeeded; otherwise one line on stderr, and the tool is off.
bool ok(CUptiResult result, const char* call)
{
    if (result == CUPTI_SUCCESS) return true;
    const char* reason = nullptr;
    if (cuptiGetResultString(result, &reason) != CUPTI_SUCCESS || reason == nullptr) reason = "unknown error";
    std::fprintf(stderr, "replica kernel_trace: %s failed: %s\n", call, reason);
    disable();
    return false;
}
#define CUPTI_OK(call) ok((call), #call)

// Sorts the intervals and merges those that overlap or touch; their union is unchanged.
void merge(std::vector<Interval>& v)
{
    std::sort(v.begin(), v.end());
    std::size_t n = 0;
    for (const Interval& i : v) {
        if (n > 0 && i.first <= v[n - 1].second)
            v[n - 1].second = std::max(v[n - 1].second, i.second);
        else
            v[n++] = i;
    }
    v.resize(n);
}

// GPU start and end of a record, with its device; traced is false for the kinds we do not trace.
struct Span {
    std::uint64_t start = 0, end = 0;
    std::uint32_t device = 0;
    bool traced = false;
};

template <class Record>
Span span_of(const CUpti_Activity* r)
{
    auto a = reinterpret_cast<const Record*>(r);
    return {a->start, a->end, a->deviceId, true};
}

Span span(const CUpti_Activity* r)
{
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return span_of<CUpti_ActivityKernel10>(r);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return span_of<CUpti_ActivityMemcpy6>(r);
    case CUPTI_ACTIVITY_KIND_MEMCPY2: return span_of<CUpti_ActivityMemcpyPtoP4>(r);
    case CUPTI_ACTIVITY_KIND_MEMSET: return span_of<CUpti_ActivityMemset4>(r);
    default: return {};
    }
}

Direction direction(std::uint8_t copy_kind)
{
    switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return htod;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return dtoh;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return dtod;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return ptop;
    default: return other;
    }
}

// Keeps an activity for the timeline, when one was asked for; name only for kernels.
void keep(State& s, const Span& t, std::uint8_t kind, std::string_view name = {})
{
    if (s.timeline.empty()) return;
    if (s.events.size() >= timeline_limit) {
        ++s.left_out;
        return;
    }
    std::uint32_t index = no_name;
    if (kind == kernel_kind) {
        auto it = s.name_index.find(name);
        if (it == s.name_index.end()) {
            it = s.name_index.emplace(std::string(name), static_cast<std::uint32_t>(s.names.size())).first;
            s.names.push_back(&it->first);
        }
        index = it->second;
    }
    s.events.push_back({t.start, t.end, index, static_cast<std::uint16_t>(t.device), kind});
}

void record(State& s, const CUpti_Activity* r)
{
    const Span t = span(r);
    if (!t.traced) return;
    if (t.start == 0 || t.end < t.start) {   // cut short by the flush at exit
        ++s.incomplete;
        return;
    }
    if (t.start < s.window_start) {
        ++s.before_window;
        return;
    }
    s.first = std::min(s.first, t.start);
    s.last = std::max(s.last, t.end);
    DeviceStats& d = s.devices[t.device];
    const std::uint64_t ns = t.end - t.start;
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const char* name = reinterpret_cast<const CUpti_ActivityKernel10*>(r)->name;
        const std::string_view key = name != nullptr ? name : "<unnamed>";
        auto it = d.kernels.find(key);
        if (it == d.kernels.end()) it = d.kernels.emplace(std::string(key), Totals{}).first;
        it->second.add(ns);
        d.kernel.add(ns);
        keep(s, t, kernel_kind, key);
        d.busy.emplace_back(t.start, t.end);
        if (d.busy.size() >= d.busy_limit) {
            merge(d.busy);
            d.busy_limit = std::max(d.busy_limit, 2 * d.busy.size());
        }
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
        d.copies[direction(c->copyKind)].add(ns, c->bytes);
        keep(s, t, direction(c->copyKind));
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
        d.copies[ptop].add(ns, reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(r)->bytes);
        keep(s, t, ptop);
        break;
    default:
        d.memset.add(ns, reinterpret_cast<const CUpti_ActivityMemset4*>(r)->bytes);
        keep(s, t, memset_kind);
    }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records)
{
    *buffer = state().enabled ? static_cast<std::uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, buffer_bytes))
                              : nullptr;   // declining drops the records, which is all we want when off
    *size = *buffer != nullptr ? buffer_bytes : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer, std::size_t,
                               std::size_t valid)
{
    State& s = state();
    if (s.enabled) {
        std::lock_guard lock(s.mutex);
        // Calls f on every record; false when reading the buffer failed.
        auto each = [&](auto f) {
            for (CUpti_Activity* r = nullptr;;) {
                const CUptiResult result = cuptiActivityGetNextRecord(buffer, valid, &r);
                if (result == CUPTI_ERROR_MAX_LIMIT_REACHED) return true;
                if (!ok(result, "cuptiActivityGetNextRecord")) return false;
                f(r);
            }
        };
        // Buffers come in the order they were filled, so the earliest activity is in the first one.
        if (!s.have_origin) {
            std::uint64_t earliest = UINT64_MAX;
            each([&](const CUpti_Activity* r) {
                if (const Span t = span(r); t.traced && t.start != 0) earliest = std::min(earliest, t.start);
            });
            if (earliest != UINT64_MAX) {
                s.origin = earliest;
                s.window_start = earliest + static_cast<std::uint64_t>(s.start_ms * 1e6);
                s.have_origin = true;
            }
        }
        if (s.have_origin) each([&](const CUpti_Activity* r) { record(s, r); });
        std::size_t dropped = 0;   // records CUPTI had no buffer for
        if (CUPTI_OK(cuptiActivityGetNumDroppedRecords(context, stream, &dropped))) s.dropped += dropped;
    }
    std::free(buffer);
}

[[gnu::format(printf, 2, 3)]] void appendf(std::string& out, const char* format, ...)
{
    va_list args, again;
    va_start(args, format);
    va_copy(again, args);
    const int n = std::vsnprintf(nullptr, 0, format, args);
    if (n > 0) {
        const std::size_t at = out.size();
        out.resize(at + n + 1);
        std::vsnprintf(out.data() + at, n + 1, format, again);
        out.resize(at + n);
    }
    va_end(again);
    va_end(args);
}

std::string demangle(const std::string& name)
{
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> plain(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                      &std::free);
    std::string s = status == 0 && plain ? plain.get() : name;
    if (s.size() > name_width) s = s.substr(0, name_width - 3) + "...";
    return s;
}

std::string report(State& s)
{
    const double ms = 1e-6;
    const double window = s.first < s.last ? (s.last - s.first) * ms : 0;
    std::string out;
    appendf(out, "== replica kernel_trace [%s] pid %d: window %.3f ms, from %.3f ms after the first GPU activity\n",
            s.label.c_str(), static_cast<int>(s.pid), window, s.first < s.last ? (s.first - s.origin) * ms : 0.0);
    appendf(out, "   %llu records before the window, %llu incomplete, %llu dropped%s\n",
            static_cast<unsigned long long>(s.before_window), static_cast<unsigned long long>(s.incomplete),
            static_cast<unsigned long long>(s.dropped),
            s.enabled ? "" : "; the tool was switched off: figures incomplete");
    for (auto& [id, d] : s.devices) {
        merge(d.busy);
        double busy = 0;
        for (const Interval& i : d.busy)
            busy += (i.second - i.first) * ms;
        appendf(
            out,
            "-- device %u: %llu kernels (%zu distinct), kernel time %.3f ms, GPU busy %.3f ms = %.1f%% of the window\n",
            id, static_cast<unsigned long long>(d.kernel.count), d.kernels.size(), d.kernel.ns * ms, busy,
            window > 0 ? 100 * busy / window : 0.0);
        for (int k = 0; k < directions; ++k)
            if (const Totals& c = d.copies[k]; c.count > 0)
                appendf(out, "   memcpy %-5s %10.3f ms %8llu copies %12.3f MB %8.2f GB/s\n", direction_names[k],
                        c.ns * ms, static_cast<unsigned long long>(c.count), c.bytes * 1e-6,
                        c.ns > 0 ? double(c.bytes) / c.ns : 0.0);
        if (d.memset.count > 0)
            appendf(out, "   memset       %10.3f ms %8llu sets   %12.3f MB\n", d.memset.ns * ms,
                    static_cast<unsigned long long>(d.memset.count), d.memset.bytes * 1e-6);
        std::vector<const std::pair<const std::string, Totals>*> rows;
        for (const auto& k : d.kernels)
            rows.push_back(&k);
        const std::size_t shown = std::min(s.top, rows.size());
        std::partial_sort(rows.begin(), rows.begin() + shown, rows.end(),
                          [](auto a, auto b) { return a->second.ns > b->second.ns; });
        appendf(out, "   %10s %8s %10s %6s  kernel\n", "total ms", "calls", "mean us", "share");
        std::uint64_t rest = 0;
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const Totals& t = rows[i]->second;
            if (i >= shown) {
                rest += t.ns;
                continue;
            }
            appendf(out, "   %10.3f %8llu %10.2f %5.1f%%  %s\n", t.ns * ms, static_cast<unsigned long long>(t.count),
                    t.ns * 1e-3 / t.count, d.kernel.ns > 0 ? 100.0 * t.ns / d.kernel.ns : 0.0,
                    demangle(rows[i]->first).c_str());
        }
        if (rows.size() > shown)
            appendf(out, "   %10.3f %8s %10s %5.1f%%  (%zu other kernels)\n", rest * ms, "", "",
                    d.kernel.ns > 0 ? 100.0 * rest / d.kernel.ns : 0.0, rows.size() - shown);
    }
    if (s.devices.empty()) out += "   no GPU activity in the window\n";
    return out;
}

// Writes the timeline kept (REPLICA_TRACE_TIMELINE) to its file, replacing it. A process that kept
// nothing writes nothing, so that a parent which only asked for the device count leaves its child's be.
void write_timeline(State& s)
{
    if (s.timeline.empty() || (s.events.empty() && s.left_out == 0)) return;
    std::FILE* file = std::fopen(s.timeline.c_str(), "w");
    if (file == nullptr) {
        std::fprintf(stderr, "replica kernel_trace: cannot open %s\n", s.timeline.c_str());
        return;
    }
    std::sort(s.events.begin(), s.events.end(), [](const Event& a, const Event& b) {
        return std::tie(a.start, a.device, a.end) < std::tie(b.start, b.device, b.end);
    });
    std::vector<std::string> shown;   // demangled and cut, by name index
    shown.reserve(s.names.size());
    for (const std::string* name : s.names)
        shown.push_back(demangle(*name));
    std::fprintf(file, "# replica kernel_trace timeline [%s] pid %d: device start_us end_us kind name\n",
                 s.label.c_str(), static_cast<int>(s.pid));
    std::fprintf(file, "# times in us after the first GPU activity; kind: kernel, HtoD, DtoH, DtoD, PtoP, memset, "
                       "other; name: the demangled kernel name, cut to %zu characters (\"-\" for the others)\n",
                 name_width);
    std::fprintf(file, "# %zu activities, %llu left out (at most %zu are kept)\n", s.events.size(),
                 static_cast<unsigned long long>(s.left_out), timeline_limit);
    std::fprintf(file, "# %llu records before the window, %llu incomplete, %llu dropped%s\n",
                 static_cast<unsigned long long>(s.before_window), static_cast<unsigned long long>(s.incomplete),
                 static_cast<unsigned long long>(s.dropped),
                 s.enabled ? "" : "; the tool was switched off: timeline incomplete");
    for (const Event& e : s.events) {
        const char* kind = e.kind == kernel_kind   ? "kernel"
                           : e.kind == memset_kind ? "memset"
                                                   : direction_names[e.kind];
        std::fprintf(file, "%u %.3f %.3f %s %s\n", static_cast<unsigned>(e.device), (e.start - s.origin) * 1e-3,
                     (e.end - s.origin) * 1e-3, kind, e.name != no_name ? shown[e.name].c_str() : "-");
    }
    if (std::fclose(file) != 0) std::fprintf(stderr, "replica kernel_trace: writing %s failed\n", s.timeline.c_str());
}

void at_exit()
{
    State& s = state();
    if (getpid() != s.pid) return;   // a forked child: its parent reports
    if (s.enabled) CUPTI_OK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));   // delivers what is left
    std::lock_guard lock(s.mutex);
    const std::string text = report(s);
    std::FILE* file = s.out.empty() ? nullptr : std::fopen(s.out.c_str(), "a");
    if (!s.out.empty() && file == nullptr)
        std::fprintf(stderr, "replica kernel_trace: cannot open %s\n", s.out.c_str());
    std::fwrite(text.data(), 1, text.size(), file != nullptr ? file : stderr);   // one write: reports do not interleave
    if (file != nullptr) std::fclose(file);
    write_timeline(s);
}

std::string env(const char* name, const char* otherwise)
{
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : otherwise;
}

double env_number(const char* name, double otherwise)
{
    const std::string v = env(name, "");
    if (v.empty()) return otherwise;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (*end == '\0' && x >= 0) return x;
    std::fprintf(stderr, "replica kernel_trace: ignoring %s=%s (not a number >= 0)\n", name, v.c_str());
    return otherwise;
}

}   // namespace

// Called by the CUDA driver, once, during cuInit of a process started with CUDA_INJECTION64_PATH set.
// Returns 1 even when the set-up fails, so that the program runs on without the tool.
extern "C" [[gnu::visibility("default")]] int InitializeInjection(void)
{
    static std::atomic<bool> once{false};
    if (once.exchange(true)) return 1;
    State& s = state();
    s.pid = getpid();
    s.start_ms = env_number("REPLICA_TRACE_START_MS", 0);
    s.top = static_cast<std::size_t>(env_number("REPLICA_TRACE_TOP", 40));
    s.out = env("REPLICA_TRACE_OUT", "");
    s.label = env("REPLICA_TRACE_LABEL", "");
    s.timeline = env("REPLICA_TRACE_TIMELINE", "");
    if (const std::size_t at = s.timeline.find("%p"); at != std::string::npos)
        s.timeline.replace(at, 2, std::to_string(s.pid));
    // The record layouts below are those of this CUPTI major version; another one (e.g. a PyTorch
    // wheel's own libcupti) may lay them out differently.
    std::uint32_t version = 0;
    if (!CUPTI_OK(cuptiGetVersion(&version))) return 1;
    if (version / 10000 != CUPTI_API_VERSION / 10000) {
        std::fprintf(stderr, "replica kernel_trace: built for CUPTI API %u, loaded %u: off\n", CUPTI_API_VERSION,
                     version);
        return 1;
    }
    if (!CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed))) return 1;
    s.enabled = true;
    if (!CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) ||
        !CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)) ||
        !CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2)) ||
        !CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET)))
        return 1;
    if (std::atexit(at_exit) != 0) {
        std::fprintf(stderr, "replica kernel_trace: atexit failed: no report\n");
        disable();
    }
    return 1;
}
