// What the gates' drivers (dca_logits.cpp, dca_embd.cpp) share: llama.cpp's log filter, the options both take, the
// argument loop and the context parameters they make, the model and the context, the generated token sequence, the
// output's writing and the end of its JSON line, the cleanup. Header-only (static functions): each driver is one
// translation unit.
#pragma once

#include "llama.h"
#include "ggml.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

// the last line of both drivers' usage: DCA's options (with -DDCA, the patched llama.h)
static const char * const GATE_USAGE_DCA =
#ifdef DCA
    "  --dca on|off  --dca-chunk-size S  --dca-local-size W  --dca-yarn-factor F|auto|pos|chunk|len|model  --dca-self-extend G\n";
#else
    "";
#endif

static bool g_verbose = false;   // -v: every llama.cpp log line, not only warnings and errors

static void log_cb(enum ggml_log_level level, const char * text, void * /*user*/) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

// -ctk / -ctv: the cache types the drivers accept
static bool parse_type(const std::string & s, ggml_type & t) {
    static const struct { const char * name; ggml_type type; } types[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q5_1", GGML_TYPE_Q5_1}, {"q5_0", GGML_TYPE_Q5_0},
        {"q4_1", GGML_TYPE_Q4_1}, {"q4_0", GGML_TYPE_Q4_0}, {"iq4_nl", GGML_TYPE_IQ4_NL},
    };
    for (const auto & e : types) {
        if (s == e.name) { t = e.type; return true; }
    }
    return false;
}

static bool parse_onoff(const std::string & s, bool & v) {
    if (s == "on" || s == "1" || s == "true")   { v = true;  return true; }
    if (s == "off" || s == "0" || s == "false") { v = false; return true; }
    return false;
}

// BOS, then n_tokens - 1 bytes from a 64-bit LCG of seed (high bits): the same sequence on every platform
static std::vector<llama_token> lcg_tokens(uint64_t seed, int n_tokens, llama_token bos) {
    std::vector<llama_token> tokens;
    tokens.push_back(bos);
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (int i = 1; i < n_tokens; ++i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tokens.push_back((llama_token) ((s >> 33) & 0xff));
    }
    return tokens;
}

// the options both drivers take: the model and the output, the context's sizes, flash attention, the cache types,
// threads, llama.cpp's logs and (with -DDCA, the patched llama.h) DCA's settings
struct gate_opts {
    std::string model_path;
    std::string out_path;
    int       n_ctx    = 0;    // 0: the driver's default
    int       n_batch  = 512;
    int       n_ubatch = 512;
    bool      fa       = false;
    ggml_type ctk      = GGML_TYPE_F16;
    ggml_type ctv      = GGML_TYPE_F16;
    int       threads  = 2;
#ifdef DCA
    bool      dca       = false;
    int       dca_chunk = 0;
    int       dca_local = 0;
    float     dca_yarn  = -3.0f;  // llama.cpp's default: model (the GGUF's own, else off); 0 = off; -1 = auto ((n_ctx_seq / trained context)^(1/ln 2) past it), -2 = pos (per query)
    int       dca_self_extend = 0; // Self-Extend's group size in place of DCA's chunks (0: DCA)
#endif
};

// the option at argv[i], its value consumed: 1 when it is one of gate_opts', 0 when it is not, -1 (after a message)
// when its value is missing or not one the option takes
static int parse_gate_opt(gate_opts & o, int argc, char ** argv, int & i) {
    const std::string a = argv[i];
    std::string v;
    bool missing = false;
    auto value = [&]() {
        missing = i + 1 >= argc;
        if (!missing) {
            v = argv[++i];
        }
        return !missing;
    };
    auto text  = [&](std::string & dst) { return value() && (dst = v, true); };
    auto whole = [&](int & dst)         { return value() && (dst = std::stoi(v), true); };
    bool ok = true;
    if      (a == "-m" || a == "--model")           ok = text(o.model_path);
    else if (a == "-o" || a == "--out")             ok = text(o.out_path);
    else if (a == "-c" || a == "--n-ctx")           ok = whole(o.n_ctx);
    else if (a == "-b" || a == "--n-batch")         ok = whole(o.n_batch);
    else if (a == "-ub" || a == "--n-ubatch")       ok = whole(o.n_ubatch);
    else if (a == "-fa" || a == "--flash-attn")     ok = value() && parse_onoff(v, o.fa);
    else if (a == "-ctk" || a == "--cache-type-k")  ok = value() && parse_type(v, o.ctk);
    else if (a == "-ctv" || a == "--cache-type-v")  ok = value() && parse_type(v, o.ctv);
    else if (a == "-t" || a == "--threads")         ok = whole(o.threads);
    else if (a == "-v")                             g_verbose = true;
#ifdef DCA
    else if (a == "--dca")                          ok = value() && parse_onoff(v, o.dca);
    else if (a == "--dca-chunk-size")               ok = whole(o.dca_chunk);
    else if (a == "--dca-local-size")               ok = whole(o.dca_local);
    else if (a == "--dca-yarn-factor")              ok = value() && (o.dca_yarn = v == "auto" ? -1.0f : v == "pos" ? -2.0f : v == "model" ? -3.0f : v == "chunk" ? -4.0f : v == "len" ? -5.0f : std::stof(v), true);
    else if (a == "--dca-self-extend")              ok = whole(o.dca_self_extend);
#endif
    else return 0;
    if (missing) {
        fprintf(stderr, "missing value for %s\n", a.c_str());
    } else if (!ok) {
        fprintf(stderr, "bad value '%s' for %s\n", v.c_str(), a.c_str());
    }
    return ok ? 1 : -1;
}

// a driver's own option at a (own: true when a is one; next() is its value, a missing one exits 1 after usage)
using gate_own_opt = std::function<bool(const std::string & a, const std::function<std::string()> & next)>;

// the command line: gate_opts' options, -h/--help, and the driver's own; -1 when the driver goes on, else its exit
// code: 0 after --help, 1 after usage for an unknown option or a bad or missing value
static int gate_parse_args(gate_opts & o, int argc, char ** argv, void (*usage)(const char *), const gate_own_opt & own) {
    for (int i = 1; i < argc; ++i) {
        const int r = parse_gate_opt(o, argc, argv, i);
        if (r < 0) { usage(argv[0]); return 1; }
        if (r > 0) continue;
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); usage(argv[0]); exit(1); }
            return argv[++i];
        };
        if (own(a, next)) continue;
        if (a == "-h" || a == "--help") { usage(argv[0]); return 0; }
        fprintf(stderr, "unknown option %s\n", a.c_str());
        usage(argv[0]);
        return 1;
    }
    return -1;
}

// the context parameters of gate_opts (one sequence, no performance counters; the driver sets the rest)
static llama_context_params gate_context_params(const gate_opts & o) {
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = o.n_ctx;
    cparams.n_batch         = o.n_batch;
    cparams.n_ubatch        = o.n_ubatch;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = o.threads;
    cparams.n_threads_batch = o.threads;
    cparams.flash_attn_type = o.fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k          = o.ctk;
    cparams.type_v          = o.ctv;
    cparams.no_perf         = true;
#ifdef DCA
    cparams.dca             = o.dca;
    cparams.dca_chunk_size  = o.dca_chunk;
    cparams.dca_local_size  = o.dca_local;
    cparams.dca_yarn_factor = o.dca_yarn;
    cparams.dca_self_extend = o.dca_self_extend;
#endif
    return cparams;
}

// the model of gate_opts with ngl layers offloaded; nullptr after a message when it does not load
static llama_model * gate_load_model(const gate_opts & o, int ngl) {
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = ngl;
    llama_model * model = llama_model_load_from_file(o.model_path.c_str(), mparams);
    if (!model) {
        fprintf(stderr, "error: failed to load %s\n", o.model_path.c_str());
    }
    return model;
}

// a context of the model with cparams; nullptr after a message (and the model freed) when it cannot be made
static llama_context * gate_init_context(llama_model * model, const llama_context_params & cparams) {
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "error: failed to create the context\n");
        llama_model_free(model);
    }
    return ctx;
}

// the logits as raw little-endian f32 into gate_opts' output; false after a message when it cannot be written
static bool gate_write_f32(const gate_opts & o, const std::vector<float> & out) {
    FILE * f = fopen(o.out_path.c_str(), "wb");
    bool ok = f && fwrite(out.data(), sizeof(float), out.size(), f) == out.size();
    if (f && fclose(f) != 0) {
        ok = false;
    }
    if (!ok) {
        fprintf(stderr, "error: cannot write %s\n", o.out_path.c_str());
    }
    return ok;
}

// how many of the values are NaN or infinite
static size_t gate_count_nonfinite(const std::vector<float> & out) {
    size_t n = 0;
    for (float v : out) n += !std::isfinite(v);
    return n;
}

// the end of the drivers' one line of JSON: DCA's settings (with -DDCA) and the exit code
static void gate_print_json_end(const gate_opts & o, int rc) {
#ifdef DCA
    printf(", \"dca\": %s, \"dca_chunk_size\": %d, \"dca_local_size\": %d",
           o.dca ? "true" : "false", o.dca_chunk, o.dca_local);
#else
    (void) o;
#endif
    printf(", \"rc\": %d}\n", rc);
}

// the context, the model and the backend freed, in that order
static void gate_free(llama_context * ctx, llama_model * model) {
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
}
