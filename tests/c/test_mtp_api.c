// C-level test of the MTP API of the patched libllama (patches/0001..0009), no Python involved.
//
// usage: test_mtp_api TARGET.gguf ASSISTANT.gguf [EXTRA_ASSISTANT.gguf ...]
//
// TARGET/ASSISTANT: a Gemma 4 pair (e.g. tests/fixtures/dense-{target,assistant}.gguf). Each EXTRA assistant
// (e.g. a centroid-head one) is attached to a fresh copy of TARGET and checked for sync/async agreement and
// drafts inside the vocab. Prints one line per check and a final "N passed, M failed"; exit status 0 iff
// nothing failed. Set MTP_TEST_VERBOSE=1 to see llama.cpp's log.

#include "llama.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <process.h>
#define test_getpid _getpid
#else
#include <unistd.h>
#define test_getpid getpid
#endif

static int n_passed = 0;
static int n_failed = 0;

static void check(bool ok, const char * what) {
    if (ok) {
        n_passed++;
        printf("ok   - %s\n", what);
    } else {
        n_failed++;
        printf("FAIL - %s\n", what);
    }
    fflush(stdout);
}

static void check_rc(int32_t rc, int32_t expected, const char * what) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s (rc %d, expected %d)", what, rc, expected);
    check(rc == expected, buf);
}

static void log_cb(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    if (user_data != NULL) {
        fputs(text, stderr);
    }
}

static int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

// the state after a prompt: the token to draft from, its position - 1 and the hidden state that produced it
struct prompt_state {
    llama_token last;
    llama_pos   attn_pos;
    float     * h;
};

static struct llama_context * new_context(struct llama_model * model, uint32_t n_seq_max) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = 512;
    cp.n_batch         = 256;
    cp.n_ubatch        = 256;
    cp.n_seq_max       = n_seq_max;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    cp.embeddings      = true;  // h_prev is the target's hidden state
    cp.swa_full        = false; // exercise the windowed SWA cache
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    return llama_init_from_model(model, cp);
}

// decode prompt[0..n) into seq_id starting at pos0; returns false on failure
static bool decode_prompt(struct llama_context * ctx, const llama_token * prompt, int n, llama_seq_id seq_id, llama_pos pos0,
                          struct prompt_state * st, int n_embd, int n_vocab) {
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i]     = prompt[i];
        batch.pos[i]       = pos0 + i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = seq_id;
        batch.logits[i]    = i == n - 1;
    }
    batch.n_tokens = n;
    const int32_t rc = llama_decode(ctx, batch);
    llama_batch_free(batch);
    if (rc != 0) {
        return false;
    }
    st->last     = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    st->attn_pos = pos0 + n - 1;
    memcpy(st->h, llama_get_embeddings_ith(ctx, n - 1), n_embd*sizeof(float));
    return true;
}

static void make_prompt(llama_token * out, int n, unsigned seed, int n_vocab) {
    unsigned x = seed*2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x*1103515245u + 12345u;
        out[i] = 5 + (int) ((x >> 8) % (unsigned) (n_vocab - 5));
    }
}

static bool same_tokens(const llama_token * a, const llama_token * b, int n) {
    return memcmp(a, b, n*sizeof(llama_token)) == 0;
}

static bool same_floats(const float * a, const float * b, int n) {
    return memcmp(a, b, n*sizeof(float)) == 0;
}

static bool file_truncated_copy(const char * src, const char * dst, double frac) {
    FILE * f = fopen(src, "rb");
    if (!f) {
        return false;
    }
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    const long n = (long) (size*frac);
    char * buf = (char *) malloc(n > 0 ? n : 1);
    const bool ok_read = fread(buf, 1, n, f) == (size_t) n;
    fclose(f);
    FILE * g = fopen(dst, "wb");
    bool ok = ok_read && g && fwrite(buf, 1, n, g) == (size_t) n;
    if (g) {
        fclose(g);
    }
    free(buf);
    return ok;
}

// checks that need only a loaded target: attach errors and success
static void test_attach(const char * path_tgt, const char * path_asst, struct llama_model_params mp) {
    struct llama_model * tgt = llama_model_load_from_file(path_tgt, mp);
    check(tgt != NULL, "load target");
    if (!tgt) {
        return;
    }

    check_rc(llama_model_load_mtp_from_file(NULL, path_asst, mp), LLAMA_MTP_ERR_INVALID_ARG, "attach: NULL model");
    check_rc(llama_model_load_mtp_from_file(tgt, NULL, mp),       LLAMA_MTP_ERR_INVALID_ARG, "attach: NULL path");
    check_rc(llama_model_load_mtp_from_file(tgt, "/nonexistent/assistant.gguf", mp), LLAMA_MTP_ERR_LOAD, "attach: missing file");
    check_rc(llama_model_load_mtp_from_file(tgt, path_tgt, mp), LLAMA_MTP_ERR_ARCH, "attach: a target GGUF is not an assistant");

    char path_trunc[512];
    const char * tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path_trunc, sizeof(path_trunc), "%s/test_mtp_api_%d_truncated.gguf", tmp, (int) test_getpid());
    for (int i = 0; i < 2; i++) {
        const double frac = i == 0 ? 0.5 : 0.02; // tensor data cut / header cut
        if (file_truncated_copy(path_asst, path_trunc, frac)) {
            check_rc(llama_model_load_mtp_from_file(tgt, path_trunc, mp), LLAMA_MTP_ERR_LOAD,
                     i == 0 ? "attach: truncated tensor data" : "attach: truncated header");
            remove(path_trunc);
        }
    }

    check(!llama_model_has_mtp_assistant(tgt), "failed attaches leave no assistant");
    check(llama_model_get_mtp_assistant(tgt) == NULL, "no assistant: get returns NULL");
    check(llama_model_mtp_n_embd_backbone(tgt) == 0, "no assistant: backbone width 0");

    check_rc(llama_model_load_mtp_from_file(tgt, path_asst, mp), LLAMA_MTP_OK, "attach the assistant");
    check(llama_model_has_mtp_assistant(tgt), "has assistant after attach");
    check(llama_model_get_mtp_assistant(tgt) != NULL, "get assistant after attach");
    check(llama_model_mtp_n_embd_backbone(tgt) == llama_model_n_embd(tgt), "backbone width == target n_embd");
    check_rc(llama_model_load_mtp_from_file(tgt, path_asst, mp), LLAMA_MTP_ERR_ATTACHED, "attach twice");

    llama_model_free(tgt); // frees the assistant with it
    check(true, "free a target with its assistant");
}

static void test_no_assistant(const char * path_tgt, struct llama_model_params mp) {
    struct llama_model * tgt = llama_model_load_from_file(path_tgt, mp);
    if (!tgt) {
        check(false, "load target without assistant");
        return;
    }
    struct llama_context * ctx = new_context(tgt, 1);
    const int n_embd = llama_model_n_embd(tgt);
    float * h = (float *) calloc(n_embd, sizeof(float));
    llama_token drafts[LLAMA_MTP_MAX_STEPS];

    check_rc(llama_decode_mtp_async(ctx, 0, 0, 5, h, 2), LLAMA_MTP_ERR_NO_ASSISTANT, "submit without assistant");
    check_rc(llama_decode_mtp_wait(ctx, drafts, NULL), LLAMA_MTP_ERR_NO_ASSISTANT, "wait without assistant");
    check_rc(llama_decode_mtp(ctx, 0, 0, 5, h, 2, drafts, NULL, NULL), LLAMA_MTP_ERR_NO_ASSISTANT, "sync without assistant");
    struct llama_mtp_stats st = llama_mtp_get_stats(ctx);
    check(st.n_requests == 0 && st.n_graph_builds == 0, "stats are zero without requests");

    free(h);
    llama_free(ctx);
    llama_model_free(tgt);
}

static void test_drafting(const char * path_tgt, const char * path_asst, struct llama_model_params mp) {
    struct llama_model * tgt = llama_model_load_from_file(path_tgt, mp);
    if (!tgt || llama_model_load_mtp_from_file(tgt, path_asst, mp) != LLAMA_MTP_OK) {
        check(false, "load target + assistant");
        llama_model_free(tgt);
        return;
    }

    const int n_embd  = llama_model_mtp_n_embd_backbone(tgt);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(tgt));
    const int n_steps = 4;

    struct llama_context * ctx = new_context(tgt, 2);
    llama_memory_t mem = llama_get_memory(ctx);

    llama_token prompt[40];
    make_prompt(prompt, 40, 1, n_vocab);

    struct prompt_state st;
    st.h = (float *) malloc(n_embd*sizeof(float));
    check(decode_prompt(ctx, prompt, 24, 0, 0, &st, n_embd, n_vocab), "decode a 24-token prompt (past the sliding window)");

    // reference: sync with logits
    llama_token ref[LLAMA_MTP_MAX_STEPS];
    float * ref_h = (float *) malloc(n_embd*sizeof(float));
    float * logits = (float *) malloc((size_t) LLAMA_MTP_MAX_STEPS*n_vocab*sizeof(float));
    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, n_steps, ref, logits, ref_h), LLAMA_MTP_OK, "sync draft with logits");
    {
        bool ok = true;
        for (int k = 0; k < n_steps; k++) {
            ok = ok && ref[k] >= 0 && ref[k] < n_vocab && argmax(logits + (size_t) k*n_vocab, n_vocab) == ref[k];
        }
        check(ok, "drafts are in the vocab and are the argmax of their logits rows");
    }

    llama_token d[LLAMA_MTP_MAX_STEPS];
    float * h_last = (float *) malloc(n_embd*sizeof(float));

    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, n_steps, d, NULL, h_last), LLAMA_MTP_OK, "sync draft without logits");
    check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "sync without logits == sync with logits");

    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "async submit");
    check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait");
    check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "async + wait == sync (drafts and h_prev_last bit-identical)");

    // fewer steps: a prefix of the longer request
    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, 2, d, NULL, NULL), LLAMA_MTP_OK, "sync draft, 2 steps");
    check(same_tokens(d, ref, 2), "2 drafts are a prefix of 4 drafts");

    // one request in flight
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (busy checks)");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_ERR_BUSY, "second submit while in flight");
    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, n_steps, d, NULL, NULL), LLAMA_MTP_ERR_BUSY, "sync while in flight");
    check_rc(llama_decode_mtp_wait(ctx, NULL, NULL), LLAMA_MTP_ERR_INVALID_ARG, "wait with NULL out_drafts (nothing consumed)");
    check_rc(llama_decode_mtp_wait(ctx, d, NULL), LLAMA_MTP_OK, "wait for the first request");
    check(same_tokens(d, ref, n_steps), "the first request's drafts are intact");
    check_rc(llama_decode_mtp_wait(ctx, d, NULL), LLAMA_MTP_ERR_BUSY, "wait with nothing pending");

    // invalid arguments
    const int n_seq_max = (int) llama_n_seq_max(ctx);
    check_rc(llama_decode_mtp_async(NULL, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_ERR_INVALID_ARG, "NULL ctx");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, NULL, n_steps), LLAMA_MTP_ERR_INVALID_ARG, "NULL h_prev");
    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, n_steps, NULL, NULL, NULL), LLAMA_MTP_ERR_INVALID_ARG, "sync: NULL out_drafts");
    check_rc(llama_decode_mtp_wait(NULL, d, NULL), LLAMA_MTP_ERR_INVALID_ARG, "wait: NULL ctx");
    check_rc(llama_decode_mtp_async(ctx, -1, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_ERR_SEQ_ID, "seq_id -1");
    check_rc(llama_decode_mtp_async(ctx, n_seq_max, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_ERR_SEQ_ID, "seq_id n_seq_max");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, 0), LLAMA_MTP_ERR_N_STEPS, "n_steps 0");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, LLAMA_MTP_MAX_STEPS + 1), LLAMA_MTP_ERR_N_STEPS, "n_steps MAX+1");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, -1, st.h, n_steps), LLAMA_MTP_ERR_TOKEN, "last_token -1");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, n_vocab, st.h, n_steps), LLAMA_MTP_ERR_TOKEN, "last_token n_vocab");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos - 1, st.last, st.h, n_steps), LLAMA_MTP_ERR_POS, "attn_pos below pos_max");
    check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos + 1, st.last, st.h, n_steps), LLAMA_MTP_ERR_POS, "attn_pos above pos_max");
    check_rc(llama_decode_mtp_async(ctx, 0, -1, st.last, st.h, n_steps), LLAMA_MTP_ERR_POS, "attn_pos -1");
    check_rc(llama_decode_mtp_async(ctx, 1, 0, st.last, st.h, n_steps), LLAMA_MTP_ERR_POS, "empty sequence");
    check_rc(llama_decode_mtp_wait(ctx, d, NULL), LLAMA_MTP_ERR_BUSY, "rejected submits leave nothing in flight");
    check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, LLAMA_MTP_MAX_STEPS, d, NULL, NULL), LLAMA_MTP_OK, "n_steps MAX");
    check(same_tokens(d, ref, n_steps), "MAX steps start with the same drafts");

    // h_prev is copied at submit
    {
        float * h_tmp = (float *) malloc(n_embd*sizeof(float));
        memcpy(h_tmp, st.h, n_embd*sizeof(float));
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, h_tmp, n_steps), LLAMA_MTP_OK, "submit (h_prev copy)");
        for (int i = 0; i < n_embd; i++) {
            h_tmp[i] = 1e30f;
        }
        free(h_tmp);
        check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait (h_prev copy)");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "h_prev changed/freed after submit changes nothing");
    }

    // the target appends past attn_pos while a request is in flight (the verification batch)
    {
        const int32_t drains0 = llama_mtp_get_stats(ctx).n_drains;
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (append in flight)");
        llama_token verify[LLAMA_MTP_MAX_STEPS + 1];
        verify[0] = st.last;
        memcpy(verify + 1, ref, n_steps*sizeof(llama_token));
        struct prompt_state tmp;
        tmp.h = (float *) malloc(n_embd*sizeof(float));
        check(decode_prompt(ctx, verify, n_steps + 1, 0, st.attn_pos + 1, &tmp, n_embd, n_vocab), "decode the verification batch while in flight");
        check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait (append in flight)");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "appending past attn_pos changes nothing");

        // positions above attn_pos may be removed while in flight
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_ERR_POS, "attn_pos is no longer pos_max");
        check(llama_memory_seq_rm(mem, 0, st.attn_pos + 1, -1), "seq_rm the verification batch");
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (seq_rm above attn_pos)");
        check(decode_prompt(ctx, verify, n_steps + 1, 0, st.attn_pos + 1, &tmp, n_embd, n_vocab), "append again while in flight");
        check(llama_memory_seq_rm(mem, 0, st.attn_pos + 1, -1), "seq_rm above attn_pos while in flight");
        check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait (seq_rm above attn_pos)");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "seq_rm above attn_pos changes nothing");
        check(llama_mtp_get_stats(ctx).n_drains == drains0, "one append and seq_rm above attn_pos do not wait for the request");

        // a second append may reuse sliding-window cells the request still reads: that decode waits for it
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (two appends)");
        check(decode_prompt(ctx, verify, 1, 0, st.attn_pos + 1, &tmp, n_embd, n_vocab), "first append while in flight");
        check(decode_prompt(ctx, verify + 1, n_steps, 0, st.attn_pos + 2, &tmp, n_embd, n_vocab), "second append while in flight");
        check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait (two appends)");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "two appends in flight change nothing");
        check(llama_mtp_get_stats(ctx).n_drains == drains0 + 1, "the second append waited for the request");
        check(llama_memory_seq_rm(mem, 0, st.attn_pos + 1, -1), "seq_rm the appended positions");
        free(tmp.h);
    }

    // a second sequence (non-unified KV: its own stream) with the same prompt drafts the same tokens
    {
        struct prompt_state st1;
        st1.h = (float *) malloc(n_embd*sizeof(float));
        check(decode_prompt(ctx, prompt, 24, 1, 0, &st1, n_embd, n_vocab), "decode the prompt into seq 1");
        check_rc(llama_decode_mtp(ctx, 1, st1.attn_pos, st1.last, st1.h, n_steps, d, NULL, NULL), LLAMA_MTP_OK, "sync draft on seq 1");
        check(st1.last == st.last && same_tokens(d, ref, n_steps), "seq 1 drafts == seq 0 drafts");
        check(llama_memory_seq_rm(mem, 1, -1, -1), "clear seq 1");
        free(st1.h);
    }

    // steady state: speculative rounds with target decodes in between reuse the drafting graph
    {
        // the graph was last built for seq 1: one request on seq 0 brings it back
        check_rc(llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, n_steps, d, NULL, NULL), LLAMA_MTP_OK, "warm-up draft on seq 0");
        struct llama_mtp_stats s0 = llama_mtp_get_stats(ctx);
        bool ok = true;
        struct prompt_state cur = st;
        cur.h = (float *) malloc(n_embd*sizeof(float));
        memcpy(cur.h, st.h, n_embd*sizeof(float));
        float * hv = (float *) malloc((size_t) (n_steps + 1)*n_embd*sizeof(float));
        for (int r = 0; r < 20 && ok; r++) {
            llama_token da[LLAMA_MTP_MAX_STEPS], ds[LLAMA_MTP_MAX_STEPS];
            ok = ok && llama_decode_mtp_async(ctx, 0, cur.attn_pos, cur.last, cur.h, n_steps) == LLAMA_MTP_OK;
            ok = ok && llama_decode_mtp_wait(ctx, da, NULL) == LLAMA_MTP_OK;
            ok = ok && llama_decode_mtp(ctx, 0, cur.attn_pos, cur.last, cur.h, n_steps, ds, NULL, NULL) == LLAMA_MTP_OK;
            ok = ok && same_tokens(da, ds, n_steps);
            if (!ok) {
                break;
            }
            // verify, accept greedily, keep the accepted prefix
            struct llama_batch batch = llama_batch_init(n_steps + 1, 0, 1);
            for (int i = 0; i <= n_steps; i++) {
                batch.token[i]     = i == 0 ? cur.last : da[i - 1];
                batch.pos[i]       = cur.attn_pos + 1 + i;
                batch.n_seq_id[i]  = 1;
                batch.seq_id[i][0] = 0;
                batch.logits[i]    = 1;
            }
            batch.n_tokens = n_steps + 1;
            ok = ok && llama_decode(ctx, batch) == 0;
            llama_batch_free(batch);
            if (!ok) {
                break;
            }
            int acc = 0;
            llama_token next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
            while (acc < n_steps && next == da[acc]) {
                acc++;
                next = argmax(llama_get_logits_ith(ctx, acc), n_vocab);
            }
            memcpy(cur.h, llama_get_embeddings_ith(ctx, acc), n_embd*sizeof(float));
            cur.attn_pos += 1 + acc;
            cur.last = next;
            ok = ok && llama_memory_seq_rm(mem, 0, cur.attn_pos + 1, -1);
        }
        free(hv);
        struct llama_mtp_stats s1 = llama_mtp_get_stats(ctx);
        check(ok, "20 speculative rounds: async == sync every round");
        char buf[256];
        snprintf(buf, sizeof(buf), "steady state: %d graph builds over %d requests (reuses %d)",
                 s1.n_graph_builds - s0.n_graph_builds, s1.n_requests - s0.n_requests, s1.n_graph_reuses - s0.n_graph_reuses);
        check(s1.n_graph_builds == s0.n_graph_builds && s1.n_requests - s0.n_requests == 40, buf);
        check(s1.n_steps - s0.n_steps == 40*n_steps, "stats count the steps");
        // back to the prompt state for the drain tests
        llama_memory_seq_rm(mem, 0, st.attn_pos + 1, -1);
        free(cur.h);
    }

    // destructive operations with a request in flight wait for it; its result stays valid
    {
        const int32_t drains0 = llama_mtp_get_stats(ctx).n_drains;
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (seq_rm at attn_pos)");
        check(llama_memory_seq_rm(mem, 1, -1, -1), "seq_rm of another sequence while in flight");
        check(llama_mtp_get_stats(ctx).n_drains == drains0, "seq_rm of another sequence does not wait");
        check(llama_memory_seq_rm(mem, 0, st.attn_pos, -1), "seq_rm at attn_pos while in flight (drains)");
        check(llama_mtp_get_stats(ctx).n_drains == drains0 + 1, "seq_rm at attn_pos waited for the request");
        check_rc(llama_decode_mtp_wait(ctx, d, h_last), LLAMA_MTP_OK, "wait after a draining seq_rm");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "a drained request returns its drafts intact");

        struct prompt_state st2;
        st2.h = (float *) malloc(n_embd*sizeof(float));
        check(decode_prompt(ctx, prompt + st.attn_pos, 1, 0, st.attn_pos, &st2, n_embd, n_vocab), "re-decode the removed position");
        check(st2.last == st.last, "the re-decoded position predicts the same token");

        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (clear)");
        llama_memory_clear(mem, true);
        check(llama_mtp_get_stats(ctx).n_drains == drains0 + 2, "llama_memory_clear waited for the request");
        check_rc(llama_decode_mtp_wait(ctx, d, NULL), LLAMA_MTP_OK, "wait after llama_memory_clear");
        check(same_tokens(d, ref, n_steps), "drafts intact after a draining clear");

        check(decode_prompt(ctx, prompt, 24, 0, 0, &st2, n_embd, n_vocab), "re-decode the prompt after clear");
        check_rc(llama_decode_mtp(ctx, 0, st2.attn_pos, st2.last, st2.h, n_steps, d, NULL, NULL), LLAMA_MTP_OK, "draft after clear");
        check(same_tokens(d, ref, n_steps), "same drafts after clear + re-decode");
        free(st2.h);

        // free the context with a request in flight
        check_rc(llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, n_steps), LLAMA_MTP_OK, "submit (free in flight)");
        llama_free(ctx);
        check(true, "llama_free with a request in flight");
    }

    // a context that never drafted frees cleanly, and a new one drafts the same tokens
    {
        struct llama_context * ctx2 = new_context(tgt, 1);
        struct prompt_state st3;
        st3.h = (float *) malloc(n_embd*sizeof(float));
        check(decode_prompt(ctx2, prompt, 24, 0, 0, &st3, n_embd, n_vocab), "decode the prompt in a new context");
        check_rc(llama_decode_mtp(ctx2, 0, st3.attn_pos, st3.last, st3.h, n_steps, d, NULL, h_last), LLAMA_MTP_OK, "draft in a new context");
        check(same_tokens(d, ref, n_steps) && same_floats(h_last, ref_h, n_embd), "a new context drafts the same tokens and h");
        free(st3.h);
        llama_free(ctx2);
    }

    free(h_last);
    free(logits);
    free(ref_h);
    free(st.h);
    llama_model_free(tgt);
}

// an extra assistant (e.g. the centroid head): drafts in the vocab, async == sync, argmax of the logits
static void test_extra_assistant(const char * path_tgt, const char * path_asst, struct llama_model_params mp) {
    char what[512];
    struct llama_model * tgt = llama_model_load_from_file(path_tgt, mp);
    const int32_t rc = tgt ? llama_model_load_mtp_from_file(tgt, path_asst, mp) : LLAMA_MTP_ERR_LOAD;
    snprintf(what, sizeof(what), "attach %s", path_asst);
    check_rc(rc, LLAMA_MTP_OK, what);
    if (rc != LLAMA_MTP_OK) {
        llama_model_free(tgt);
        return;
    }
    const int n_embd  = llama_model_mtp_n_embd_backbone(tgt);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(tgt));
    struct llama_context * ctx = new_context(tgt, 1);
    llama_memory_t mem = llama_get_memory(ctx);

    bool ok = true;
    float * logits = (float *) malloc((size_t) 8*n_vocab*sizeof(float));
    struct prompt_state st;
    st.h = (float *) malloc(n_embd*sizeof(float));
    for (unsigned seed = 1; seed <= 5 && ok; seed++) {
        llama_token prompt[30];
        const int n = 3 + (int) (seed*7 % 27);
        make_prompt(prompt, n, 100 + seed, n_vocab);
        llama_memory_clear(mem, true);
        ok = ok && decode_prompt(ctx, prompt, n, 0, 0, &st, n_embd, n_vocab);
        llama_token ds[8], da[8];
        ok = ok && llama_decode_mtp(ctx, 0, st.attn_pos, st.last, st.h, 8, ds, logits, NULL) == LLAMA_MTP_OK;
        ok = ok && llama_decode_mtp_async(ctx, 0, st.attn_pos, st.last, st.h, 8) == LLAMA_MTP_OK;
        ok = ok && llama_decode_mtp_wait(ctx, da, NULL) == LLAMA_MTP_OK;
        ok = ok && same_tokens(ds, da, 8);
        for (int k = 0; k < 8 && ok; k++) {
            ok = ds[k] >= 0 && ds[k] < n_vocab && argmax(logits + (size_t) k*n_vocab, n_vocab) == ds[k];
        }
    }
    snprintf(what, sizeof(what), "%s: 5 prompts x 8 steps, drafts in [0, n_vocab), async == sync, argmax of logits", path_asst);
    check(ok, what);

    free(st.h);
    free(logits);
    llama_free(ctx);
    llama_model_free(tgt);
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TARGET.gguf ASSISTANT.gguf [EXTRA_ASSISTANT.gguf ...]\n", argv[0]);
        return 2;
    }

    const char * verbose = getenv("MTP_TEST_VERBOSE");
    llama_log_set(log_cb, verbose && atoi(verbose) ? (void *) 1 : NULL);

    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();

    test_attach(argv[1], argv[2], mp);
    test_no_assistant(argv[1], mp);
    test_drafting(argv[1], argv[2], mp);
    for (int i = 3; i < argc; i++) {
        test_extra_assistant(argv[1], argv[i], mp);
    }

    llama_backend_free();

    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
