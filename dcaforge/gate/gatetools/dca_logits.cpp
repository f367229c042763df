// dca_logits: evaluate a token sequence with llama.cpp and dump every position's logits.
//
// Build (dcaforge/gate/gatetools/build_logits.py does this):
//   g++ -O2 -std=c++17 [-DDCA] -I<tree>/include -I<tree>/ggml/include dca_logits.cpp \
//       <build>/src/libllama.a <build>/ggml/src/libggml.a <build>/ggml/src/libggml-cpu.a \
//       <build>/ggml/src/libggml-base.a -fopenmp -lpthread -ldl -lm -o dca_logits
// -DDCA enables the --dca* options, which set llama_context_params fields that only the
// patched (0078-dca) llama.h has.
//
// Output: raw little-endian f32, n_seq x n_rows x n_vocab, row-major (sequence, position, vocab);
// n_rows = n_tokens, or n_tokens - P with --shift M --shift-at P.
// stdout: one line of JSON with n_tokens, n_vocab, n_seq, n_ctx and the settings used.
// Exit codes: 0 ok, 1 usage, 2 model/context creation failed, 3 decode failed,
// 4 non-finite logits (only with --check-finite), 5 state file refused (--state-load).

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "gatetool.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

static void usage(const char * argv0) {
    fprintf(stderr,
        "usage: %s -m MODEL -o OUT.f32 [options]\n"
        "  --tokens FILE          whitespace-separated token ids (default: generated)\n"
        "  --seed N --n-tokens N  generated sequence: BOS, then N-1 pseudo-random bytes 0..255 (seed 1, 512)\n"
        "  --bos N                BOS id for generated sequences (default: the model's)\n"
        "  -c, --n-ctx N          context size (default: n_tokens * n_seq)\n"
        "  -b, --n-batch N        tokens per llama_decode call (default 512)\n"
        "  -ub, --n-ubatch N      ubatch size (default 512)\n"
        "  -fa, --flash-attn on|off (default off)\n"
        "  -ctk, -ctv TYPE        cache types: f32 f16 bf16 q8_0 q5_1 q5_0 q4_1 q4_0 iq4_nl (default f16)\n"
        "  -t, --threads N        (default 2)\n"
        "  --n-seq K              evaluate the sequence as K identical sequences interleaved in one\n"
        "                         unified cache (default 1); the output holds all K\n"
        "  --swa-full             full-size SWA cache\n"
        "  --check-finite         exit 4 if any logit is NaN/inf\n"
        "  --skip M               drop the first M tokens of the sequence (after generating/reading it)\n"
        "  --shift M --shift-at P context-shift test (n-seq 1): evaluate tokens [0, P), remove [0, M) from\n"
        "                         the cache, shift [M, P) by -M (llama_memory_seq_rm/seq_add), then\n"
        "                         evaluate [P, n) at positions P-M..n-M-1; the output holds those n-P rows\n"
        "  --state-at P --state-save FILE   evaluate [0, P), llama_state_save_file, evaluate [P, n)\n"
        "  --state-at P --state-load FILE   llama_state_load_file (exit 5 if refused), evaluate [P, n);\n"
        "                         both output the n-P rows of [P, n)\n"
        "  --prompt-len N         --dca-yarn-factor len: the prompt length every sequence is given, as llama-server\n"
        "                         gives a slot its prompt's (default: all its tokens; later rows are generated ones)\n"
        "  --rpc HOST:PORT[,...]  add the devices of these rpc-servers (a build with -DGGML_RPC=ON)\n"
        "  -ngl N                 layers offloaded to the non-CPU devices (default 0; with --rpc: the RPC\n"
        "                         devices, so N below the layer count is a partial offload)\n"
        "  -v                     llama.cpp logs\n"
        "%s", argv0, GATE_USAGE_DCA);
}

int main(int argc, char ** argv) {
    gate_opts o;
    std::string tokens_path;
    uint64_t seed     = 1;
    int      n_tokens = 512;
    int      bos      = -1;
    int      n_seq    = 1;
    bool     swa_full = false;
    bool     check_finite = false;
    int      skip     = 0;
    int      shift    = 0;
    int      shift_at = 0;
    int      state_at = 0;
    std::string state_save, state_load;
    std::string rpc;
    int      ngl      = 0;
    int      prompt_len = -1;

    const int done = gate_parse_args(o, argc, argv, usage, [&](const std::string & a, const auto & next) {
        if      (a == "--tokens")                   tokens_path = next();
        else if (a == "--seed")                     seed = std::stoull(next());
        else if (a == "--n-tokens")                 n_tokens = std::stoi(next());
        else if (a == "--bos")                      bos = std::stoi(next());
        else if (a == "--n-seq")                    n_seq = std::stoi(next());
        else if (a == "--swa-full")                 swa_full = true;
        else if (a == "--check-finite")             check_finite = true;
        else if (a == "--skip")                     skip = std::stoi(next());
        else if (a == "--shift")                    shift = std::stoi(next());
        else if (a == "--shift-at")                 shift_at = std::stoi(next());
        else if (a == "--state-at")                 state_at = std::stoi(next());
        else if (a == "--state-save")               state_save = next();
        else if (a == "--state-load")               state_load = next();
        else if (a == "--rpc")                      rpc = next();
        else if (a == "--prompt-len")               prompt_len = std::stoi(next());
        else if (a == "-ngl" || a == "--n-gpu-layers") ngl = std::stoi(next());
        else return false;
        return true;
    });
    if (done >= 0) {
        return done;
    }
    if (o.model_path.empty() || o.out_path.empty() || n_seq < 1 || o.n_batch < 1 || o.n_ubatch < 1) {
        usage(argv[0]);
        return 1;
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    if (!rpc.empty()) {
        // the RPC backend's registration entry point, as common/arg.cpp's --rpc finds it
        ggml_backend_reg_t rpc_reg = ggml_backend_reg_by_name("RPC");
        auto add_server = rpc_reg ? (ggml_backend_reg_t (*)(const char *)) ggml_backend_reg_get_proc_address(rpc_reg, "ggml_backend_rpc_add_server") : nullptr;
        if (!add_server) {
            fprintf(stderr, "error: --rpc: this build has no RPC backend (-DGGML_RPC=ON)\n");
            return 2;
        }
        size_t b = 0;
        while (b <= rpc.size()) {
            const size_t e = std::min(rpc.find(',', b), rpc.size());
            ggml_backend_register(add_server(rpc.substr(b, e - b).c_str()));
            b = e + 1;
        }
    }

    llama_model * model = gate_load_model(o, ngl);
    if (!model) {
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> tokens;
    if (!tokens_path.empty()) {
        std::ifstream f(tokens_path);
        long long v;
        while (f >> v) tokens.push_back((llama_token) v);
        if (tokens.empty()) { fprintf(stderr, "error: no tokens in %s\n", tokens_path.c_str()); return 1; }
    } else {
        tokens = lcg_tokens(seed, n_tokens, bos >= 0 ? bos : llama_vocab_bos(vocab));
    }
    if (skip > 0) {
        if (skip >= (int) tokens.size()) { fprintf(stderr, "error: --skip %d >= n_tokens\n", skip); return 1; }
        tokens.erase(tokens.begin(), tokens.begin() + skip);
    }
    const int n = (int) tokens.size();
    if (o.n_ctx <= 0) o.n_ctx = n * n_seq;
    if (shift > 0 && (n_seq != 1 || shift_at <= shift || shift_at >= n)) {
        fprintf(stderr, "error: --shift needs --n-seq 1 and 0 < M < P < n_tokens\n");
        return 1;
    }
    const bool state_mode = !state_save.empty() || !state_load.empty();
    if (state_mode && (shift > 0 || state_at <= 0 || state_at >= n || (!state_save.empty() && !state_load.empty()))) {
        fprintf(stderr, "error: --state-save or --state-load (one) needs 0 < --state-at < n_tokens and no --shift\n");
        return 1;
    }

    llama_context_params cparams = gate_context_params(o);
    cparams.n_seq_max  = n_seq;
    cparams.swa_full   = swa_full;
    cparams.kv_unified = true;

    llama_context * ctx = gate_init_context(model, cparams);
    if (!ctx) {
        return 2;
    }

#ifdef DCA
    // --dca-yarn-factor len: the length of the prompt each sequence gets (a no-op for any other temperature)
    llama_dca_set_prompt_len(ctx, -1, prompt_len >= 0 ? prompt_len : n, 0);
#endif

    // per sequence, positions [p0, p0 + step) go into one llama_decode call
    const int step = o.n_batch / n_seq;
    if (step < 1) { fprintf(stderr, "error: n_batch < n_seq\n"); return 1; }

    // rows of the output: all positions, or with --shift only the tokens evaluated after the shift
    const int row0 = shift > 0 ? shift_at : state_mode ? state_at : 0;
    std::vector<float> out((size_t) n_seq * (n - row0) * n_vocab);
    llama_batch batch = llama_batch_init(step * n_seq, 0, 1);
    int rc = 0;

    // evaluate tokens [t0, t1) at positions t - pos_off; rows >= row0 are kept
    auto eval = [&](int t0, int t1, int pos_off) {
        for (int p0 = t0; p0 < t1 && rc == 0; p0 += step) {
            const int p1 = std::min(t1, p0 + step);
            batch.n_tokens = 0;
            for (int p = p0; p < p1; ++p) {
                for (int s = 0; s < n_seq; ++s) {
                    const int k = batch.n_tokens++;
                    batch.token[k]     = tokens[p];
                    batch.pos[k]       = p - pos_off;
                    batch.n_seq_id[k]  = 1;
                    batch.seq_id[k][0] = s;
                    batch.logits[k]    = p >= row0;
                }
            }
            const int ret = llama_decode(ctx, batch);
            if (ret != 0) {
                fprintf(stderr, "error: llama_decode failed (%d) at tokens %d..%d\n", ret, p0, p1 - 1);
                rc = 3;
                return;
            }
            for (int k = 0; k < batch.n_tokens; ++k) {
                if (!batch.logits[k]) continue;
                const float * l = llama_get_logits_ith(ctx, k);
                if (!l) { fprintf(stderr, "error: no logits for batch index %d\n", k); rc = 3; return; }
                const int s = batch.seq_id[k][0];
                const int r = batch.pos[k] + pos_off - row0;
                memcpy(&out[((size_t) s * (n - row0) + r) * n_vocab], l, sizeof(float) * n_vocab);
            }
        }
    };

    if (shift > 0) {
        eval(0, shift_at, 0);
        if (rc == 0) {
            llama_memory_t mem = llama_get_memory(ctx);
            if (!llama_memory_seq_rm(mem, 0, 0, shift)) {
                fprintf(stderr, "error: llama_memory_seq_rm failed\n");
                rc = 3;
            } else {
                llama_memory_seq_add(mem, 0, shift, shift_at, -shift);
                eval(shift_at, n, shift);
            }
        }
    } else if (!state_save.empty()) {
        eval(0, state_at, 0);
        if (rc == 0 && !llama_state_save_file(ctx, state_save.c_str(), tokens.data(), state_at)) {
            fprintf(stderr, "error: llama_state_save_file failed\n");
            rc = 3;
        }
        if (rc == 0) eval(state_at, n, 0);
    } else if (!state_load.empty()) {
        std::vector<llama_token> saved(n);
        size_t n_saved = 0;
        if (!llama_state_load_file(ctx, state_load.c_str(), saved.data(), saved.size(), &n_saved)) {
            fprintf(stderr, "error: llama_state_load_file refused %s\n", state_load.c_str());
            rc = 5;
        } else if ((int) n_saved != state_at || !std::equal(saved.begin(), saved.begin() + state_at, tokens.begin())) {
            fprintf(stderr, "error: the state holds %zu tokens, not the first %d of this sequence\n", n_saved, state_at);
            rc = 5;
        } else {
            eval(state_at, n, 0);
        }
    } else {
        eval(0, n, 0);
    }
    llama_batch_free(batch);

    if (rc == 0 && !gate_write_f32(o, out)) {
        rc = 1;
    }

    const size_t n_nonfinite = gate_count_nonfinite(out);
    if (rc == 0 && check_finite && n_nonfinite) rc = 4;

    printf("{\"n_tokens\": %d, \"n_rows\": %d, \"n_vocab\": %d, \"n_seq\": %d, \"n_ctx\": %u, \"n_batch\": %d, \"n_ubatch\": %d, "
           "\"flash_attn\": %s, \"type_k\": \"%s\", \"type_v\": \"%s\", \"nonfinite\": %zu",
           n, n - row0, n_vocab, n_seq, llama_n_ctx(ctx), o.n_batch, o.n_ubatch, o.fa ? "true" : "false",
           ggml_type_name(o.ctk), ggml_type_name(o.ctv), n_nonfinite);
    gate_print_json_end(o, rc);

    gate_free(ctx, model);
    return rc;
}
