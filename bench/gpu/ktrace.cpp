// ktrace: GPU time per CUDA kernel of a whole program run, through CUPTI's activity API (the GPU machine has no nsys).
//
//   g++ -O2 -shared -fPIC -o ktrace.so bench/gpu/ktrace.cpp -I$CUDA/include -L$CUDA/lib64 -lcupti
//   CUDA_INJECTION64_PATH=$PWD/ktrace.so KTRACE_OUT=kernels.tsv llama-batched-bench ...
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when the program creates its first context and
// calls InitializeInjection, which asks CUPTI for a record of every kernel (CONCURRENT_KERNEL: kernels keep running
// concurrently, kernels launched from CUDA graphs included). At exit the records are flushed and KTRACE_OUT (default:
// stderr) gets one row per kernel: launches, total GPU time in microseconds, mean in microseconds, and the demangled
// name without its argument list; the rows are sorted by total time, the last row is the sum.
//
// KTRACE_TIMELINE=path also records the host's side and writes every record in time order (bench/gpu/ktrace_timeline.py
// reads it): the CUDA runtime's API calls (launches, copies, synchronisations, graph launches) and the copies besides
// the kernels, one row each: type (k kernel, m copy, r runtime call), start and end in ns from the first record, an
// extra field (kernel: the CUDA graph's id, 0 outside one; copy: bytes; call: correlation id) and a name (kernel name,
// copy direction HtoD/DtoH/DtoD/..., runtime call name). The calls cost the host some time of their own, the same for
// every run traced this way.

#include <cupti.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct ktrace_stat {
    uint64_t n  = 0;
    uint64_t ns = 0;
};

std::mutex                         g_mutex;
std::map<std::string, ktrace_stat> g_stats; // by mangled name

struct ktrace_event {
    char     type;  // 'k', 'm', 'r'
    uint64_t start;
    uint64_t end;
    uint64_t extra;
    uint32_t name;  // into g_names
};

bool                                 g_timeline = false;
std::vector<ktrace_event>            g_events;
std::vector<std::string>             g_names;    // kernel names (mangled), copy kinds, runtime call names
std::map<std::string, uint32_t>      g_name_ids;

uint32_t ktrace_name_id(const std::string & name) {
    auto it = g_name_ids.find(name);
    if (it != g_name_ids.end()) {
        return it->second;
    }
    g_names.push_back(name);
    return g_name_ids[name] = (uint32_t) g_names.size() - 1;
}

const char * ktrace_copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
        default:                             return "copy";
    }
}

std::string ktrace_api_name(CUpti_CallbackId cbid) {
    const char * name = nullptr;
    if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS || !name) {
        return "runtime_" + std::to_string(cbid);
    }
    return name;
}

constexpr size_t KTRACE_BUF = 8u << 20;

void CUPTIAPI ktrace_buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *buffer      = (uint8_t *) aligned_alloc(8, KTRACE_BUF);
    *size        = *buffer ? KTRACE_BUF : 0;
    *max_records = 0;
}

void CUPTIAPI ktrace_buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid) {
    CUpti_Activity * rec = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
            if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
                const auto * m = (const CUpti_ActivityMemcpy6 *) rec;
                g_events.push_back({'m', m->start, m->end, m->bytes, ktrace_name_id(ktrace_copy_kind(m->copyKind))});
                continue;
            }
            if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
                const auto * a = (const CUpti_ActivityAPI *) rec;
                g_events.push_back({'r', a->start, a->end, a->correlationId, ktrace_name_id(ktrace_api_name(a->cbid))});
                continue;
            }
            if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
                continue;
            }
            const auto * k = (const CUpti_ActivityKernel10 *) rec;
            ktrace_stat & s = g_stats[k->name ? k->name : "?"];
            s.n  += 1;
            s.ns += k->end > k->start ? k->end - k->start : 0;
            if (g_timeline) {
                g_events.push_back({'k', k->start, k->end, k->graphId, ktrace_name_id(k->name ? k->name : "?")});
            }
        }
    }
    free(buffer);
}

std::string ktrace_name(const std::string & mangled) {
    int status = 0;
    char * d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    std::string name = status == 0 && d ? d : mangled;
    free(d);
    // drop the argument list: "void f<...>(int, ...)" -> "void f<...>"
    int depth = 0;
    for (size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        depth += c == '<' ? 1 : (c == '>' ? -1 : 0);
        if (c == '(' && depth == 0 && i > 0) {
            name.resize(i);
            break;
        }
    }
    if (name.rfind("void ", 0) == 0) {
        name = name.substr(5);
    }
    return name;
}

void ktrace_report() {
    cuptiActivityFlushAll(1);

    std::vector<std::pair<std::string, ktrace_stat>> rows;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        rows.assign(g_stats.begin(), g_stats.end());
    }
    std::sort(rows.begin(), rows.end(), [](const auto & a, const auto & b) { return a.second.ns > b.second.ns; });

    const char * path = getenv("KTRACE_OUT");
    FILE * f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        f = stderr;
    }
    uint64_t n = 0, ns = 0;
    fprintf(f, "launches\ttotal_us\tmean_us\tkernel\n");
    for (const auto & r : rows) {
        fprintf(f, "%llu\t%.1f\t%.2f\t%s\n", (unsigned long long) r.second.n, r.second.ns/1e3,
                r.second.ns/1e3/std::max<uint64_t>(1, r.second.n), ktrace_name(r.first).c_str());
        n  += r.second.n;
        ns += r.second.ns;
    }
    fprintf(f, "%llu\t%.1f\t%.2f\t(all kernels)\n", (unsigned long long) n, ns/1e3, ns/1e3/std::max<uint64_t>(1, n));
    if (f != stderr) {
        fclose(f);
    }

    const char * tpath = getenv("KTRACE_TIMELINE");
    if (!g_timeline || !tpath || !*tpath) {
        return;
    }
    FILE * t = fopen(tpath, "w");
    if (!t) {
        fprintf(stderr, "ktrace: cannot write %s\n", tpath);
        return;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    std::sort(g_events.begin(), g_events.end(), [](const ktrace_event & a, const ktrace_event & b) {
        return a.start < b.start;
    });
    const uint64_t t0 = g_events.empty() ? 0 : g_events.front().start;
    std::vector<std::string> shown(g_names.size());
    for (size_t i = 0; i < g_names.size(); ++i) {
        shown[i] = ktrace_name(g_names[i]);
    }
    fprintf(t, "type\tstart_ns\tend_ns\textra\tname\n");
    for (const auto & e : g_events) {
        fprintf(t, "%c\t%llu\t%llu\t%llu\t%s\n", e.type, (unsigned long long) (e.start - t0),
                (unsigned long long) (e.end > e.start ? e.end - t0 : e.start - t0), (unsigned long long) e.extra,
                shown[e.name].c_str());
    }
    fclose(t);
}

} // namespace

extern "C" int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(ktrace_buffer_requested, ktrace_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: CUPTI refused the kernel activity records\n");
        return 0;
    }
    const char * tpath = getenv("KTRACE_TIMELINE");
    if (tpath && *tpath) {
        if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
            cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
            fprintf(stderr, "ktrace: CUPTI refused the runtime or copy records: no timeline\n");
        } else {
            g_timeline = true;
            g_events.reserve(1u << 20);
        }
    }
    atexit(ktrace_report);
    return 1;
}
