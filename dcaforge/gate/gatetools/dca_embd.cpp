// dca_embd: a token sequence with a span of input embeddings (an image's, say) fed through the real API as
// multimodal front ends do it: a llama_batch with embd, decoded after llama_set_causal_attn(ctx, false), then text
// again with causal attention. Dumps every position's logits.
//
// Build (dcaforge/gate/gatetools/build_logits.py builds it with src=EMBD_SRC):
//   g++ -O2 -std=c++17 [-DDCA] -I<tree>/include -I<tree>/ggml/include dca_embd.cpp <libllama.a and libggml*.a> \
//       -fopenmp -lpthread -ldl -lm -o dca_embd
//
// The sequence: the tokens of dca_logits (BOS, then bytes of a 64-bit LCG of --seed), where positions [P, P+M)
// (--embd-at P --embd-n M) hold M embedding vectors instead (n_embd floats each, uniform in [-1, 1) from a 64-bit LCG
// of --embd-seed: s = s*6364136223846793005 + 1442695040888963407, value = ((s >> 40) / 2^24)*2 - 1, row-major).
// Tokens [0, P) go in llama_decode calls of -b tokens, the M embeddings in one call (non-causal, so one ubatch:
// -ub >= M), then tokens [P+M, n) again in calls of -b tokens. --embd-causal leaves the embeddings causal.
//
// Output: raw little-endian f32, n_tokens x n_vocab (position, vocab). stdout: one line of JSON.
// Exit codes: 0 ok, 1 usage, 2 model/context creation failed, 3 decode failed.

#include "llama.h"
#include "ggml.h"
#include "gatetool.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void usage(const char * argv0) {
    fprintf(stderr,
        "usage: %s -m MODEL -o OUT.f32 --embd-at P --embd-n M [options]\n"
        "  --seed N --n-tokens N   the token sequence (as dca_logits: BOS, then LCG bytes; 1, 512)\n"
        "  --embd-seed N           the embedding values (default 1)\n"
        "  --embd-causal           decode the embeddings with causal attention (default: non-causal)\n"
        "  -c, --n-ctx N           context size (default: n_tokens)\n"
        "  -b, --n-batch N         tokens per llama_decode call for the text (default 64)\n"
        "  -ub, --n-ubatch N       ubatch size (default 512, >= M)\n"
        "  -fa, --flash-attn on|off (default off)\n"
        "  -ctk, -ctv TYPE         cache types: f32 f16 bf16 q8_0 q5_1 q5_0 q4_1 q4_0 iq4_nl (default f16)\n"
        "  -t, --threads N         (default 2)\n"
        "  -v                      llama.cpp logs\n"
        "%s", argv0, GATE_USAGE_DCA);
}

int main(int argc, char ** argv) {
    gate_opts o;
    o.n_batch = 64;               // the text's tokens per llama_decode call
    uint64_t seed      = 1;
    uint64_t embd_seed = 1;
    int      n_tokens  = 512;
    int      embd_at   = -1;
    int      embd_n    = 0;
    bool     embd_causal = false;

    const int done = gate_parse_args(o, argc, argv, usage, [&](const std::string & a, const auto & next) {
        if      (a == "--seed")                     seed = std::stoull(next());
        else if (a == "--embd-seed")                embd_seed = std::stoull(next());
        else if (a == "--n-tokens")                 n_tokens = std::stoi(next());
        else if (a == "--embd-at")                  embd_at = std::stoi(next());
        else if (a == "--embd-n")                   embd_n = std::stoi(next());
        else if (a == "--embd-causal")              embd_causal = true;
        else return false;
        return true;
    });
    if (done >= 0) {
        return done;
    }
    if (o.model_path.empty() || o.out_path.empty() || embd_at < 1 || embd_n < 1 || embd_at + embd_n > n_tokens ||
            o.n_batch < 1 || o.n_ubatch < embd_n) {
        usage(argv[0]);
        return 1;
    }
    if (o.n_ctx <= 0) {
        o.n_ctx = n_tokens;
    }
    const int n_batch = o.n_batch;

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model * model = gate_load_model(o, 0);
    if (!model) {
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_embd  = llama_model_n_embd(model);

    // the tokens of dca_logits (BOS, then LCG bytes) and the embedding values (LCG, uniform in [-1, 1))
    const std::vector<llama_token> tokens = lcg_tokens(seed, n_tokens, llama_vocab_bos(vocab));
    std::vector<float> embd((size_t) embd_n * n_embd);
    {
        uint64_t s = embd_seed;
        for (auto & x : embd) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            x = (float) ((double) (s >> 40) / 16777216.0 * 2.0 - 1.0);
        }
    }

    llama_context_params cparams = gate_context_params(o);
    cparams.n_batch = std::max(n_batch, embd_n); // the embeddings in one call

    llama_context * ctx = gate_init_context(model, cparams);
    if (!ctx) {
        return 2;
    }

    std::vector<float> out((size_t) n_tokens * n_vocab);
    int rc = 0;

    auto keep = [&](int k, int p) {
        const float * l = llama_get_logits_ith(ctx, k);
        if (!l) {
            fprintf(stderr, "error: no logits for batch index %d\n", k);
            rc = 3;
            return;
        }
        memcpy(&out[(size_t) p * n_vocab], l, sizeof(float) * n_vocab);
    };

    // text [t0, t1), -b tokens per call
    auto eval_text = [&](int t0, int t1) {
        llama_batch batch = llama_batch_init(n_batch, 0, 1);
        for (int p0 = t0; p0 < t1 && rc == 0; p0 += n_batch) {
            const int p1 = std::min(t1, p0 + n_batch);
            batch.n_tokens = 0;
            for (int p = p0; p < p1; ++p) {
                const int k = batch.n_tokens++;
                batch.token[k]     = tokens[p];
                batch.pos[k]       = p;
                batch.n_seq_id[k]  = 1;
                batch.seq_id[k][0] = 0;
                batch.logits[k]    = true;
            }
            const int ret = llama_decode(ctx, batch);
            if (ret != 0) {
                fprintf(stderr, "error: llama_decode failed (%d) at tokens %d..%d\n", ret, p0, p1 - 1);
                rc = 3;
                break;
            }
            for (int k = 0; k < batch.n_tokens && rc == 0; ++k) {
                keep(k, p0 + k);
            }
        }
        llama_batch_free(batch);
    };

    eval_text(0, embd_at);

    if (rc == 0) {
        llama_batch batch = llama_batch_init(embd_n, n_embd, 1);
        batch.n_tokens = embd_n;
        memcpy(batch.embd, embd.data(), embd.size()*sizeof(float));
        for (int k = 0; k < embd_n; ++k) {
            batch.pos[k]       = embd_at + k;
            batch.n_seq_id[k]  = 1;
            batch.seq_id[k][0] = 0;
            batch.logits[k]    = true;
        }
        if (!embd_causal) {
            llama_set_causal_attn(ctx, false);
        }
        const int ret = llama_decode(ctx, batch);
        llama_set_causal_attn(ctx, true);
        if (ret != 0) {
            fprintf(stderr, "error: llama_decode of the embeddings failed (%d)\n", ret);
            rc = 3;
        }
        for (int k = 0; k < embd_n && rc == 0; ++k) {
            keep(k, embd_at + k);
        }
        llama_batch_free(batch);
    }

    if (rc == 0) {
        eval_text(embd_at + embd_n, n_tokens);
    }

    if (rc == 0 && !gate_write_f32(o, out)) {
        rc = 1;
    }

    const size_t n_nonfinite = gate_count_nonfinite(out);

    printf("{\"n_tokens\": %d, \"n_vocab\": %d, \"n_embd\": %d, \"embd_at\": %d, \"embd_n\": %d, \"embd_causal\": %s, "
           "\"n_ctx\": %u, \"flash_attn\": %s, \"nonfinite\": %zu",
           n_tokens, n_vocab, n_embd, embd_at, embd_n, embd_causal ? "true" : "false", llama_n_ctx(ctx),
           o.fa ? "true" : "false", n_nonfinite);
    gate_print_json_end(o, rc);

    gate_free(ctx, model);
    return rc;
}
