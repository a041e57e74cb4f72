/*
 * quality_score.c - `ds4-quality score MODEL MANIFEST OUT.tsv` (see
 * quality_tools.h).
 *
 * For each item: prefill the prompt, then teacher-force the reference
 * tokens one by one. At step s, with the model's logits before reference
 * token s:
 *   nll      += -log softmax(logits)[ref_s]
 *   first     = argmax at step 0 == ref_0
 *   prefix    = steps before the first argmax != ref (the length of the
 *               common prefix of our greedy continuation and the reference:
 *               up to the first difference both have seen the same tokens)
 *   overlap  += |our top-k ∩ reference top-k| / |reference top-k|
 *   top_kl   += sum over the reference top-k of p log(p / q), p the
 *               reference probabilities and q ours, both renormalised over
 *               the reference's top-k (the KL divergence on that support:
 *               how far the distribution moved, where NLL sees only the
 *               one token; 0 for the reference model itself; for a greedy
 *               API capture, whose alternatives carry logprob -9999, it is
 *               -log q of the chosen token)
 * The TSV has one row per item (the mean overlap over its steps), so two
 * runs can be joined by id (`ds4-quality compare`).
 */
#include "tools/quality_tools.h"

#include "include/ds4_sampler.h"
#include "tools/quality_manifest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* log sum exp of the logits: -log softmax(l)[t] = lse - l[t]. */
static double lse_of(const float *l, int n)
{
    float mx = l[0];
    for (int i = 1; i < n; i++)
        if (l[i] > mx) mx = l[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - mx);
    return log(s) + mx;
}

static double top_kl(const float *l, double lse, const int32_t *ids, const double *lp, int n)
{
    double zp = 0, zq = 0, kl = 0;
    for (int i = 0; i < n; i++) {
        zp += exp(lp[i]);
        zq += exp((double)l[ids[i]] - lse);
    }
    if (!(zp > 0) || !(zq > 0)) return 0;
    for (int i = 0; i < n; i++) {
        double p = exp(lp[i]) / zp;
        if (p > 0) kl += p * (log(p) - ((double)l[ids[i]] - lse - log(zq)));
    }
    return kl;
}

int quality_score(const quality_run_opts *o, const char *model_path, const char *manifest, const char *out)
{
    ds4_tokenizer *tok = ds4_tokenizer_load(model_path);
    if (!tok) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        return 1;
    }
    quality_manifest m;
    if (quality_manifest_load(manifest, tok, &m) != DS4_OK) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        ds4_tokenizer_free(tok);
        return 1;
    }
    ds4_tokenizer_free(tok);
    int64_t need = 16;
    for (int i = 0; i < m.n_items; i++)
        if ((int64_t)m.items[i].prompt.n + m.items[i].n_steps > need) need = (int64_t)m.items[i].prompt.n + m.items[i].n_steps;
    ds4_model *model = NULL;
    ds4_session *s = quality_open_session(o, model_path, need, &model);
    FILE *f = s ? fopen(out, "w") : NULL;
    const int K = m.top_k > 0 ? m.top_k : 1;
    int32_t *ours = malloc((size_t)K * sizeof *ours);
    double *lps = malloc((size_t)K * sizeof *lps);
    int rc = 1;
    if (s && !f) fprintf(stderr, "ds4-quality: cannot create %s\n", out);
    if (!f || !ours || !lps) goto done;
    const int V = ds4_model_n_vocab(model);
    fprintf(f, "id\ttokens\tnll\tnll_per_token\tfirst_match\tprefix_len\ttop_overlap\ttop_kl\n");
    double tot_nll = 0, tot_first = 0, tot_prefix = 0, tot_overlap = 0, tot_kl = 0;
    int64_t tot_tok = 0;
    for (int i = 0; i < m.n_items; i++) {
        const quality_item *it = &m.items[i];
        ds4_session_reset(s);
        if (ds4_session_prefill(s, it->prompt.ids, (int64_t)it->prompt.n, NULL) != DS4_OK) {
            fprintf(stderr, "\nds4-quality: item %s: %s\n", it->id, ds4_last_error());
            goto done;
        }
        double nll = 0, overlap = 0, kl = 0;
        int prefix = 0, first = 0;
        bool same = true;
        for (int st = 0; st < it->n_steps; st++) {
            const float *l = ds4_session_logits(s);
            if (!l) {
                fprintf(stderr, "\nds4-quality: item %s: no logits\n", it->id);
                goto done;
            }
            const double lse = lse_of(l, V);
            nll += lse - (double)l[it->tok[st]];
            int32_t am = ds4_argmax(l, V);
            if (st == 0) first = am == it->tok[0];
            if (same && am == it->tok[st]) prefix++;
            else same = false;
            if (it->n_top[st] > 0) {
                int n = ds4_top_logprobs(l, V, K, ours, lps), hit = 0;
                for (int a = 0; a < it->n_top[st]; a++)
                    for (int b = 0; b < n; b++)
                        if (it->top[(size_t)st * (size_t)m.top_k + (size_t)a] == ours[b]) {
                            hit++;
                            break;
                        }
                overlap += (double)hit / it->n_top[st];
                kl += top_kl(l, lse, it->top + (size_t)st * (size_t)m.top_k, it->top_lp + (size_t)st * (size_t)m.top_k,
                             it->n_top[st]);
            }
            if (st + 1 < it->n_steps && ds4_session_decode(s, it->tok[st]) != DS4_OK) {
                fprintf(stderr, "\nds4-quality: item %s step %d: %s\n", it->id, st, ds4_last_error());
                goto done;
            }
        }
        overlap /= it->n_steps;
        kl /= it->n_steps;
        fprintf(f, "%s\t%d\t%.6f\t%.6f\t%d\t%d\t%.4f\t%.6f\n", it->id, it->n_steps, nll, nll / it->n_steps, first,
                prefix, overlap, kl);
        tot_kl += kl;
        tot_nll += nll;
        tot_tok += it->n_steps;
        tot_first += first;
        tot_prefix += prefix;
        tot_overlap += overlap;
        fprintf(stderr, "\rds4-quality: scored %d/%d items   ", i + 1, m.n_items);
    }
    fprintf(stderr, "\n");
    printf("items %d, tokens %lld: nll/token %.6f, first-token match %.3f, mean common prefix %.2f, top-%d overlap %.4f, "
           "top-%d KL %.6f\n",
           m.n_items, (long long)tot_tok, tot_nll / (double)tot_tok, tot_first / m.n_items, tot_prefix / m.n_items, m.top_k,
           tot_overlap / m.n_items, m.top_k, tot_kl / m.n_items);
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "ds4-quality: writing %s failed\n", out);
        rc = 1;
    }
    if (rc && f) remove(out);
    free(ours);
    free(lps);
    ds4_session_free(s);
    ds4_model_close(model);
    quality_manifest_free(&m);
    return rc;
}
