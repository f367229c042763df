// What the gates' drivers (dca_logits.cpp, dca_embd.cpp) share: llama.cpp's log filter, the option parsers and
// the generated token sequence. Header-only (static functions): each driver is one translation unit.
#pragma once

#include "llama.h"
#include "ggml.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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
