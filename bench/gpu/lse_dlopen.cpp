// The GPU library loads and runs DCA's attention: ggml-cuda.so, built by llamafile's own GPU script, is dlopen()ed the
// way llamafile 0.10.x's llamafile/cuda.c LinkCuda() does (dlopen, then dlsym of ggml_backend_cuda_init,
// ggml_backend_cuda_reg and ggml_backend_cuda_get_device_count, ggml_log_set optional; the registry entry is handed to
// the host's own ggml with ggml_backend_register), then one DCA attention step runs through it: three
// GGML_OP_FLASH_ATTN_EXT_LSE calls over disjoint key chunks and their GGML_OP_FLASH_ATTN_EXT_LSE_MERGE, the ops 0078 adds,
// for decode and prefill shapes of several head sizes. The same graph runs on the host's CPU backend, and both are
// compared with a double-precision reference computed here (O by NMSE, LSE by RMS error, as test-backend-ops does).
//
//   lse_dlopen LIB.so      GPU and CPU against the reference (exit 1 on a failed check)
//   lse_dlopen --cpu-only  the CPU backend alone (the program's own check, where there is no GPU)
//
// Built by bench/gpu/llamafile_real_lib.py against the clean room's ggml (its CPU backend, statically; the library
// carries its own ggml core, as llamafile's does: the host exports no ggml symbol to it).

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

typedef ggml_backend_t     (*cuda_init_t)(int);
typedef ggml_backend_reg_t (*cuda_reg_t)(void);
typedef int                (*cuda_count_t)(void);
typedef void               (*log_set_t)(ggml_log_callback, void *);

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

struct shape {
    int64_t d;     // head size (K and V)
    int64_t n_q;   // query rows (1: decode)
    int64_t h;     // query heads
    int64_t h_kv;  // KV heads (GQA)
    int64_t n_kv;  // keys, cut into 3 chunks
    const char * what;
};

struct result {
    std::vector<float> o;    // [d, h, n_q]
    std::vector<float> lse;  // per call: [h, n_q] x 3
};

// the graph: 3 LSE calls over key chunks [0, a), [a, b), [b, n_kv) (each with its causal-like mask), then the merge
static result run(ggml_backend_t backend, const shape & s, const std::vector<float> & q, const std::vector<ggml_fp16_t> & k,
                  const std::vector<ggml_fp16_t> & v, const std::vector<std::vector<ggml_fp16_t>> & masks,
                  const int64_t cut[4], float scale, bool & supported) {
    ggml_init_params ip = { 64*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * tq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.d, s.n_q, s.h, 1);
    ggml_tensor * tk[3];
    ggml_tensor * tv[3];
    ggml_tensor * tm[3];
    ggml_tensor * o[3];
    ggml_tensor * l[3];
    ggml_tensor * fa[3];
    for (int i = 0; i < 3; ++i) {
        const int64_t n = cut[i + 1] - cut[i];
        tk[i] = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s.d, n, s.h_kv, 1);
        tv[i] = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s.d, n, s.h_kv, 1);
        tm[i] = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n, s.n_q, 1, 1);
        fa[i] = ggml_flash_attn_ext_lse(ctx, tq, tk[i], tv[i], tm[i], scale, 0.0f, 0.0f);
        o[i]  = ggml_flash_attn_ext_lse_get_o(ctx, fa[i]);
        l[i]  = ggml_flash_attn_ext_lse_get_lse(ctx, fa[i]);
    }
    ggml_tensor * merged = ggml_flash_attn_ext_lse_merge(ctx, o, l, 3);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    for (int i = 0; i < 3; ++i) {
        ggml_build_forward_expand(gf, fa[i]);
    }
    ggml_build_forward_expand(gf, merged);

    supported = true;
    for (int i = 0; i < 3; ++i) {
        supported &= ggml_backend_supports_op(backend, fa[i]);
    }
    supported &= ggml_backend_supports_op(backend, merged);

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(tq, q.data(), 0, q.size()*sizeof(float));
    for (int i = 0; i < 3; ++i) {
        const size_t row = s.d*sizeof(ggml_fp16_t);
        const int64_t n = cut[i + 1] - cut[i];
        for (int64_t hk = 0; hk < s.h_kv; ++hk) {  // the chunk's keys of head hk
            ggml_backend_tensor_set(tk[i], k.data() + (hk*s.n_kv + cut[i])*s.d, hk*n*row, n*row);
            ggml_backend_tensor_set(tv[i], v.data() + (hk*s.n_kv + cut[i])*s.d, hk*n*row, n*row);
        }
        ggml_backend_tensor_set(tm[i], masks[i].data(), 0, masks[i].size()*sizeof(ggml_fp16_t));
    }
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph_compute failed\n");
        exit(1);
    }
    result r;
    r.o.resize(ggml_nelements(merged));
    ggml_backend_tensor_get(merged, r.o.data(), 0, r.o.size()*sizeof(float));
    for (int i = 0; i < 3; ++i) {
        std::vector<float> packed(ggml_nelements(fa[i]));
        ggml_backend_tensor_get(fa[i], packed.data(), 0, packed.size()*sizeof(float));
        r.lse.insert(r.lse.end(), packed.end() - s.h*s.n_q, packed.end());
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

// double precision: softmax over every unmasked key of the three chunks together, and each chunk's own LSE
static result reference(const shape & s, const std::vector<float> & q, const std::vector<ggml_fp16_t> & k,
                        const std::vector<ggml_fp16_t> & v, const std::vector<std::vector<ggml_fp16_t>> & masks,
                        const int64_t cut[4], float scale) {
    result r;
    r.o.assign(s.d*s.h*s.n_q, 0.0f);
    r.lse.assign(3*s.h*s.n_q, 0.0f);
    for (int64_t t = 0; t < s.n_q; ++t) {
        for (int64_t hq = 0; hq < s.h; ++hq) {
            const int64_t hk = hq / (s.h / s.h_kv);
            const float * qr = q.data() + (hq*s.n_q + t)*s.d;
            std::vector<double> sc(s.n_kv, -INFINITY);
            for (int i = 0; i < 3; ++i) {
                double m = -INFINITY;
                for (int64_t j = cut[i]; j < cut[i + 1]; ++j) {
                    const float mv = ggml_fp16_to_fp32(masks[i][t*(cut[i + 1] - cut[i]) + (j - cut[i])]);
                    if (std::isinf(mv)) {
                        continue;
                    }
                    double dot = 0.0;
                    for (int64_t c = 0; c < s.d; ++c) {
                        dot += (double) qr[c]*ggml_fp16_to_fp32(k[(hk*s.n_kv + j)*s.d + c]);
                    }
                    sc[j] = dot*scale + mv;
                    m = std::max(m, sc[j]);
                }
                double sum = 0.0;
                for (int64_t j = cut[i]; j < cut[i + 1]; ++j) {
                    sum += std::isinf(sc[j]) ? 0.0 : std::exp(sc[j] - m);
                }
                r.lse[(i*s.n_q + t)*s.h + hq] = sum > 0.0 ? (float) (m + std::log(sum)) : -INFINITY;
            }
            double m = -INFINITY;
            for (double x : sc) {
                m = std::max(m, x);
            }
            double sum = 0.0;
            std::vector<double> acc(s.d, 0.0);
            for (int64_t j = 0; j < s.n_kv; ++j) {
                if (std::isinf(sc[j])) {
                    continue;
                }
                const double w = std::exp(sc[j] - m);
                sum += w;
                for (int64_t c = 0; c < s.d; ++c) {
                    acc[c] += w*ggml_fp16_to_fp32(v[(hk*s.n_kv + j)*s.d + c]);
                }
            }
            for (int64_t c = 0; c < s.d; ++c) {
                r.o[(t*s.h + hq)*s.d + c] = sum > 0.0 ? (float) (acc[c]/sum) : 0.0f;
            }
        }
    }
    return r;
}

static void compare(const result & a, const result & ref, double & nmse_o, double & rms_lse) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.o.size(); ++i) {
        num += ((double) a.o[i] - ref.o[i])*((double) a.o[i] - ref.o[i]);
        den += (double) ref.o[i]*ref.o[i];
    }
    nmse_o = den > 0.0 ? num/den : num;
    double sq = 0.0;
    size_t n = 0;
    for (size_t i = 0; i < ref.lse.size(); ++i) {
        if (std::isinf(ref.lse[i]) || std::isinf(a.lse[i])) {
            if (std::isinf(ref.lse[i]) != std::isinf(a.lse[i])) {
                sq += 1e9;  // a fully masked row that is not, or the other way round
            }
            continue;
        }
        sq += ((double) a.lse[i] - ref.lse[i])*((double) a.lse[i] - ref.lse[i]);
        ++n;
    }
    rms_lse = n ? std::sqrt(sq/n) : 0.0;
}

int main(int argc, char ** argv) {
    const bool cpu_only = argc > 1 && !strcmp(argv[1], "--cpu-only");
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIB.so | --cpu-only\n", argv[0]);
        return 2;
    }
    ggml_log_set(quiet, nullptr);
    ggml_backend_t gpu = nullptr;
    if (!cpu_only) {
        // llamafile/cuda.c LinkCuda(): dlopen, then the four symbols (ggml_log_set optional)
        void * lib = dlopen(argv[1], RTLD_LAZY);
        if (!lib) {
            fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
            return 1;
        }
        auto init  = (cuda_init_t)  dlsym(lib, "ggml_backend_cuda_init");
        auto reg   = (cuda_reg_t)   dlsym(lib, "ggml_backend_cuda_reg");
        auto count = (cuda_count_t) dlsym(lib, "ggml_backend_cuda_get_device_count");
        auto logs  = (log_set_t)    dlsym(lib, "ggml_log_set");
        printf("dlopen %s: ggml_backend_cuda_init %s, _reg %s, _get_device_count %s, ggml_log_set %s\n", argv[1],
               init ? "ok" : "MISSING", reg ? "ok" : "MISSING", count ? "ok" : "MISSING", logs ? "ok" : "absent");
        if (!init || !reg || !count) {
            return 1;
        }
        if (logs) {
            logs(quiet, nullptr);
        }
        const int n_dev = count();
        printf("devices: %d\n", n_dev);
        if (n_dev < 1) {
            return 1;
        }
        ggml_backend_register(reg());  // as llamafile registers the library's backend with its own ggml
        gpu = init(0);
        if (!gpu) {
            fprintf(stderr, "ggml_backend_cuda_init(0) failed\n");
            return 1;
        }
        printf("backend: %s\n", ggml_backend_name(gpu));
    }
    ggml_backend_t cpu = ggml_backend_cpu_init();

    const shape shapes[] = {
        {128,   1, 32,  8, 4096, "decode, d128, GQA 4 (Llama/Qwen)"},
        {256,   1,  8,  4, 6144, "decode, d256, GQA 2 (Gemma)"},
        {128,  64, 16,  4, 2048, "prefill 64, d128, GQA 4"},
        { 64, 257,  4,  4, 1024, "prefill 257, d64"},
    };
    bool ok = true;
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    printf("%-36s %-8s %12s %12s  %s\n", "shape", "backend", "O nmse", "LSE rms", "verdict");
    for (const shape & s : shapes) {
        std::vector<float> q(s.d*s.n_q*s.h);
        std::vector<ggml_fp16_t> k(s.d*s.n_kv*s.h_kv), v(s.d*s.n_kv*s.h_kv);
        for (auto & x : q) x = nd(rng);
        for (auto & x : k) x = ggml_fp32_to_fp16(nd(rng));
        for (auto & x : v) x = ggml_fp32_to_fp16(nd(rng));
        const int64_t cut[4] = {0, s.n_kv/3, 2*s.n_kv/3 + 5, s.n_kv};
        // causal-like masks: query t (at position n_kv - n_q + t) sees keys <= its position; the last chunk's first
        // query row is fully masked in prefill (its LSE is -inf and the merge gives it weight 0)
        std::vector<std::vector<ggml_fp16_t>> masks(3);
        for (int i = 0; i < 3; ++i) {
            const int64_t n = cut[i + 1] - cut[i];
            masks[i].resize(n*s.n_q);
            for (int64_t t = 0; t < s.n_q; ++t) {
                const int64_t pos = s.n_kv - s.n_q + t - (s.n_q > 1 && i == 2 && t == 0 ? s.n_kv : 0);
                for (int64_t j = 0; j < n; ++j) {
                    masks[i][t*n + j] = ggml_fp32_to_fp16(cut[i] + j <= pos ? 0.0f : -INFINITY);
                }
            }
        }
        const float scale = 1.0f/std::sqrt((float) s.d);
        const result ref = reference(s, q, k, v, masks, cut, scale);
        for (ggml_backend_t b : {gpu, cpu}) {
            if (!b) {
                continue;
            }
            bool supported = false;
            const result r = run(b, s, q, k, v, masks, cut, scale, supported);
            double nmse = 0.0, rms = 0.0;
            compare(r, ref, nmse, rms);
            const bool pass = supported && nmse < 5e-4 && rms < 3e-3;
            ok &= pass;
            printf("%-36s %-8s %12.3e %12.3e  %s\n", s.what, b == gpu ? "GPU" : "CPU", nmse, rms,
                   !supported ? "NOT SUPPORTED" : pass ? "ok" : "FAIL");
        }
    }
    if (gpu) {
        ggml_backend_free(gpu);
    }
    ggml_backend_free(cpu);
    printf("%s\n", ok ? "ok: the LSE and LSE-merge ops match the double reference" : "FAILED");
    return ok ? 0 : 1;
}
