// Runs one token sequence through bitnet.cpp (its llama.cpp fork) and writes what the golden
// tests compare: the logits of every position and the graph tensors whose names are asked for.
//
//   dump MODEL.gguf OUT_DIR TOKENS NAMES
//
// TOKENS is a comma-separated list of token ids (fed directly: the golden models have no text
// vocabulary). NAMES is a comma-separated list of graph tensor names without their "-<layer>"
// suffix (e.g. "l_out,attn_norm,Qcur"). The whole sequence is one batch and one ubatch, so
// every graph tensor is computed once; flash attention is off and the KV cache is F32 (build.sh
// relaxes the fork's guard that asks for flash attention whenever V is not F16).
//
// OUT_DIR receives logits.f32 (float32 LE, [n_tokens][n_vocab]), one t<k>.f32 per captured tensor
// (its contiguous data, float32 LE, ggml order: ne0 fastest) and index.tsv with one line per
// captured tensor: file, name, ggml op, ne0, ne1, ne2, ne3. A name may be captured more than
// once (llama.cpp names a projection and its RoPE output alike); the op tells them apart.
//
// Our own code, written against the llama.h of the pinned fork (Eddie-Wang1120/llama.cpp
// 406a5036); build.sh builds it.
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Capture {
    std::string out_dir;
    std::set<std::string> names;
    std::ofstream index;
    int count = 0;
};

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) {
            parts.push_back(item);
        }
    }
    return parts;
}

// The name without its "-<layer>" suffix ("l_out-1" -> "l_out"; "result_norm" stays).
std::string base_name(const char * name) {
    std::string s(name);
    auto dash = s.rfind('-');
    if (dash != std::string::npos && dash + 1 < s.size() &&
        s.find_first_not_of("0123456789", dash + 1) == std::string::npos) {
        return s.substr(0, dash);
    }
    return s;
}

bool on_tensor(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * cap = static_cast<Capture *>(user_data);
    bool wanted = t->type == GGML_TYPE_F32 && cap->names.count(base_name(t->name)) > 0;
    if (ask) {
        return wanted;
    }
    if (!wanted) {
        return true;
    }
    if (!ggml_is_contiguous(t)) {
        std::fprintf(stderr, "dump: %s (%s) is not contiguous; skipped\n", t->name, ggml_op_name(t->op));
        return true;
    }
    std::vector<float> data(ggml_nelements(t));
    ggml_backend_tensor_get(t, data.data(), 0, data.size() * sizeof(float));
    std::string file = "t" + std::to_string(cap->count++) + ".f32";
    std::ofstream(cap->out_dir + "/" + file, std::ios::binary)
        .write(reinterpret_cast<const char *>(data.data()), data.size() * sizeof(float));
    cap->index << file << '\t' << t->name << '\t' << ggml_op_name(t->op) << '\t' << t->ne[0] << '\t'
               << t->ne[1] << '\t' << t->ne[2] << '\t' << t->ne[3] << '\n';
    return true;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL.gguf OUT_DIR TOKENS NAMES\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> tokens;
    for (const auto & t : split(argv[3])) {
        tokens.push_back(std::atoi(t.c_str()));
    }
    Capture cap;
    cap.out_dir = argv[2];
    for (const auto & n : split(argv[4])) {
        cap.names.insert(n);
    }
    cap.index.open(cap.out_dir + "/index.tsv");
    if (tokens.empty() || !cap.index) {
        std::fprintf(stderr, "dump: no tokens, or %s is not a writable directory\n", argv[2]);
        return 2;
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_load_model_from_file(argv[1], mp);
    if (model == nullptr) {
        std::fprintf(stderr, "dump: cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(tokens.size());
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn = false;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &cap;
    llama_context * ctx = llama_new_context_with_model(model, cp);
    if (ctx == nullptr) {
        std::fprintf(stderr, "dump: cannot create a context\n");
        return 1;
    }

    const int n = static_cast<int>(tokens.size());
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "dump: llama_decode failed\n");
        return 1;
    }
    const int n_vocab = llama_n_vocab(model);
    std::ofstream logits(cap.out_dir + "/logits.f32", std::ios::binary);
    for (int i = 0; i < n; ++i) {
        logits.write(reinterpret_cast<const char *>(llama_get_logits_ith(ctx, i)),
                     static_cast<std::streamsize>(n_vocab) * sizeof(float));
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_free_model(model);
    std::printf("dump: %d tokens, %d tensors, n_vocab %d\n", n, cap.count, n_vocab);
    return 0;
}
