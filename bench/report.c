/* kiln-bench's outputs: an aligned table, JSON (docs/bench-json.md), an SVG
 * bar chart, and the comparison with peers' runs. */
#include "report.h"

#include <json-c/json.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include <kiln/kiln.h>

void bench_describe_machine(bench_run *run)
{
    snprintf(run->cpu, sizeof run->cpu, "unknown");
    run->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    FILE *info = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (info && fgets(line, sizeof line, info)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon)
            continue;
        snprintf(run->cpu, sizeof run->cpu, "%s", colon + 2);
        run->cpu[strcspn(run->cpu, "\n")] = '\0';
        break;
    }
    if (info)
        fclose(info);
}

/* -- Table ----------------------------------------------------------------- */

const char *bench_number(char *buf, size_t size, double v, const char *fmt)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, fmt, v);
    return buf;
}

static bool on_cuda(const bench_run *run)
{
    return !strcmp(run->device, "cuda");
}

/* What ran the workloads, for the table's first line and the chart's. */
static const char *machine_text(const bench_run *run, char *buf, size_t size)
{
    if (on_cuda(run))
        snprintf(buf, size, "%s (CUDA), host %s, %d threads", run->gpu, run->cpu, run->threads);
    else
        snprintf(buf, size, "%s, %d threads", run->cpu, run->threads);
    return buf;
}

/* A byte count in MB, or "-" when not measured. */
static const char *megabytes(char *buf, size_t size, int64_t bytes)
{
    return bench_number(buf, size, bytes < 0 ? NAN : (double)bytes / 1e6, "%.1fM");
}

/* The matrix products' rate in TFLOP/s: each workload's products' FLOPs over
 * its eager and traced times, and over its products done alone. */
static void print_products(const bench_run *run, FILE *out)
{
    bool any = false;
    for (int i = 0; i < run->count; i++)
        any = any || !isnan(run->results[i].gemm_gflop);
    if (!any)
        return;
    fprintf(out, "\nmatrix products, TFLOP/s: their FLOPs over each time; alone: %s on the same shapes, "
                 "nothing else", on_cuda(run) ? "kiln_matmul" : "OpenBLAS sgemm");
    if (!isnan(run->peak_tflops))
        fprintf(out, "; of peak: traced against the H200's FP32 peak, %.0f TFLOP/s", run->peak_tflops);
    fprintf(out, "\n%-10s %10s %9s %9s %9s%s\n", "workload", "GFLOP", "eager", "traced", "alone",
            isnan(run->peak_tflops) ? "" : "   of peak");
    for (int i = 0; i < run->count; i++) {
        const bench_result *r = &run->results[i];
        if (isnan(r->gemm_gflop))
            continue;
        char b[4][32];
        double tflop = r->gemm_gflop / 1e3, traced = tflop / (r->traced_ms * 1e-3);
        fprintf(out, "%-10s %10.4g %9s %9s %9s", r->name, r->gemm_gflop,
                bench_number(b[0], 32, tflop / (r->eager_ms * 1e-3), "%.3g"), bench_number(b[1], 32, traced, "%.3g"),
                bench_number(b[2], 32, tflop / (r->gemms_ms * 1e-3), "%.3g"));
        if (!isnan(run->peak_tflops))
            fprintf(out, " %9s", bench_number(b[3], 32, 100 * traced / run->peak_tflops, "%.0f%%"));
        fputc('\n', out);
    }
}

void bench_print_table(const bench_run *run, FILE *out)
{
    char machine[320];
    fprintf(out, "kiln-bench: %s%s; traced by %s; %s %.1f GB/s, %s %.1f GFLOP/s; medians of %d runs\n",
            machine_text(run, machine, sizeof machine), run->quick ? ", quick sizes" : "", run->backend,
            on_cuda(run) ? "device copy" : "copy", run->probes.copy_gbps,
            on_cuda(run) ? "kiln_matmul" : "sgemm", run->probes.sgemm_gflops, run->count ? run->results[0].reps : 0);
    fprintf(out, "%-10s %-18s %10s %10s %8s %9s %9s %9s %9s %7s %10s %10s %9s %9s %8s\n", "workload", "size",
            "eager ms", "traced ms", "speedup", "1st call", "compile", "disk hit", "disk load", "kernels",
            "peak eager", "peak trace", "max diff", "limit ms", "% limit");
    for (int i = 0; i < run->count; i++) {
        const bench_result *r = &run->results[i];
        char b[11][32];
        fprintf(out, "%-10s %-18s %10s %10s %8s %9s %9s %9s %9s %7d %10s %10s %9.2g %9s %8s\n", r->name,
                r->size, bench_number(b[0], 32, r->eager_ms, "%.4g"), bench_number(b[1], 32, r->traced_ms, "%.4g"),
                bench_number(b[2], 32, r->eager_ms / r->traced_ms, "%.2fx"), bench_number(b[3], 32, r->first_call_ms, "%.3f"),
                bench_number(b[7], 32, r->compile_ms, "%.3f"), bench_number(b[4], 32, r->disk_hit_ms, "%.3f"),
                bench_number(b[8], 32, r->disk_load_ms, "%.3f"), r->kernels, megabytes(b[9], 32, r->peak_eager_bytes),
                megabytes(b[10], 32, r->peak_traced_bytes), r->max_abs_diff, bench_number(b[5], 32, r->limit_ms, "%.3f"),
                bench_number(b[6], 32, 100 * r->limit_ms / r->traced_ms, "%.0f%%"));
    }
    print_products(run, out);
}

/* -- JSON ------------------------------------------------------------------ */

static void json_number(FILE *out, const char *key, double v, const char *tail)
{
    if (isnan(v))
        fprintf(out, "\"%s\": null%s", key, tail);
    else
        fprintf(out, "\"%s\": %.6g%s", key, v, tail);
}

static void json_bytes(FILE *out, const char *key, int64_t bytes, const char *tail)
{
    if (bytes < 0)
        fprintf(out, "\"%s\": null%s", key, tail);
    else
        fprintf(out, "\"%s\": %lld%s", key, (long long)bytes, tail);
}

static void json_result(FILE *out, const bench_result *r, bool last)
{
    fprintf(out, "        {\"name\": \"%s\", \"size\": \"%s\", ", r->name, r->size);
    json_number(out, "eager_ms", r->eager_ms, ", ");
    json_number(out, "traced_ms", r->traced_ms, ", ");
    json_number(out, "first_call_ms", r->first_call_ms, ", ");
    json_number(out, "disk_hit_ms", r->disk_hit_ms, ", ");
    json_number(out, "compile_ms", r->compile_ms, ", ");
    json_number(out, "disk_load_ms", r->disk_load_ms, ", ");
    fprintf(out, "\"kernels\": %d, ", r->kernels);
    json_bytes(out, "peak_eager_bytes", r->peak_eager_bytes, ", ");
    json_bytes(out, "peak_traced_bytes", r->peak_traced_bytes, ", ");
    json_number(out, "max_abs_diff", r->max_abs_diff, ", ");
    json_number(out, "gemm_gflop", r->gemm_gflop, ", ");
    json_number(out, "limit_ms", r->limit_ms, ", ");
    if (r->limit_kind)
        fprintf(out, "\"limit_kind\": \"%s\", ", r->limit_kind);
    else
        fprintf(out, "\"limit_kind\": null, ");
    fprintf(out, "\"reps\": %d}%s\n", r->reps, last ? "" : ",");
}

static void json_serve_mode(FILE *out, const char *name, const serve_mode *m, const char *tail)
{
    fprintf(out, "        \"%s\": {", name);
    json_number(out, "total_ms", m->total_ms, ", ");
    json_number(out, "p50_ms", m->p50_ms, ", ");
    json_number(out, "p99_ms", m->p99_ms, ", ");
    fprintf(out, "\"traces\": %lld, \"kernels_compiled\": %lld, \"eager_fallbacks\": %lld, ", (long long)m->traces,
            (long long)m->kernels_compiled, (long long)m->eager_fallbacks);
    json_number(out, "max_abs_diff", m->max_abs_diff, "}");
    fprintf(out, "%s\n", tail);
}

static void json_serve(FILE *out, const bench_serve *s, const char *tail)
{
    fprintf(out, "      \"serve\": {\n        \"block\": \"%s\", \"calls\": %d,\n", s->block, s->calls);
    json_serve_mode(out, "eager", &s->eager, ",");
    json_serve_mode(out, "static", &s->fixed, ",");
    json_serve_mode(out, "static_limited", &s->fixed_limited, ",");
    json_serve_mode(out, "dynamic", &s->dynamic, ",");
    fprintf(out, "        \"warm\": [");
    for (int i = 0; i < SERVE_STEADY_SIZES; i++) {
        fprintf(out, "%s{\"batch\": %lld, ", i ? ", " : "", (long long)SERVE_STEADY[i]);
        json_number(out, "static_ms", s->steady_fixed_ms[i], ", ");
        json_number(out, "dynamic_ms", s->steady_dynamic_ms[i], "}");
    }
    fprintf(out, "]\n      }%s\n", tail);
}

static void json_matmul(FILE *out, const bench_matmul *mm)
{
    fprintf(out, "      \"matmul\": {\n        \"openblas_core\": \"%s\", ", mm->openblas_core);
    if (mm->forced_core[0])
        fprintf(out, "\"forced_core\": \"%s\",\n", mm->forced_core);
    else
        fprintf(out, "\"forced_core\": null,\n");
    fprintf(out, "        \"shapes\": [\n");
    for (int i = 0; i < mm->count; i++) {
        const bench_matmul_shape *s = &mm->shapes[i];
        fprintf(out, "          {\"name\": \"%s\", \"batch\": %lld, \"m\": %lld, \"k\": %lld, \"n\": %lld, ", s->name,
                (long long)s->batch, (long long)s->m, (long long)s->k, (long long)s->n);
        json_number(out, "kiln_gflops", s->kiln_gflops, ", ");
        json_number(out, "openblas_gflops", s->openblas_gflops, ", ");
        json_number(out, "forced_gflops", s->forced_gflops, "}");
        fprintf(out, "%s\n", i == mm->count - 1 ? "" : ",");
    }
    fprintf(out, "        ]\n      }\n");
}

int bench_write_json(const bench_run *run, const char *path)
{
    FILE *out = fopen(path, "w");
    if (!out) {
        perror(path);
        return -1;
    }
    fprintf(out, "{\n  \"schema\": \"kiln-bench/1\",\n  \"runs\": [\n    {\n");
    fprintf(out, "      \"system\": \"kiln 0.1.0\", \"eager_label\": \"eager\", "
                 "\"traced_label\": \"traced (%s)\", \"device\": \"%s\",\n", run->backend, run->device);
    fprintf(out, "      \"threads\": %d, \"quick\": %s,\n", run->threads, run->quick ? "true" : "false");
    fprintf(out, "      \"machine\": {\"cpu\": \"%s\", \"cores\": %d, ", run->cpu, run->cores);
    if (on_cuda(run))
        fprintf(out, "\"gpu\": \"%s\", ", run->gpu);
    else
        fprintf(out, "\"gpu\": null, ");
    json_number(out, "peak_fp32_tflops", run->peak_tflops, "},\n");
    fprintf(out, "      \"probes\": {");
    json_number(out, "copy_gbps", run->probes.copy_gbps, ", ");
    json_number(out, "sgemm_gflops", run->probes.sgemm_gflops, "},\n");
    fprintf(out, "      \"workloads\": [\n");
    for (int i = 0; i < run->count; i++)
        json_result(out, &run->results[i], i == run->count - 1);
    fprintf(out, "      ]%s\n", run->has_serve || run->has_matmul ? "," : "");
    if (run->has_serve)
        json_serve(out, &run->serve, run->has_matmul ? "," : "");
    if (run->has_matmul)
        json_matmul(out, &run->matmul);
    fprintf(out, "    }\n  ]\n}\n");
    return fclose(out) == 0 ? 0 : -1;
}

/* -- SVG ------------------------------------------------------------------- */

enum { SVG_WIDTH = 900, SVG_LEFT = 150, SVG_RIGHT = 150, SVG_BAR = 14, SVG_GROUP = 64, SVG_TOP = 56 };

/* x of a time on the chart's log scale, from lo to hi milliseconds. */
static double svg_x(double ms, double lo, double hi)
{
    double span = SVG_WIDTH - SVG_LEFT - SVG_RIGHT;
    return SVG_LEFT + span * (log10(ms) - log10(lo)) / (log10(hi) - log10(lo));
}

static void svg_bar(FILE *out, double ms, double lo, double hi, double y, const char *cls, const char *label)
{
    if (isnan(ms) || ms <= 0)
        return;
    double x = svg_x(ms, lo, hi);
    fprintf(out, "    <rect class=\"%s\" x=\"%d\" y=\"%.0f\" width=\"%.1f\" height=\"%d\"/>\n", cls, SVG_LEFT,
            y, x - SVG_LEFT, SVG_BAR);
    fprintf(out, "    <text x=\"%.1f\" y=\"%.0f\">%s %.3g ms</text>\n", x + 4, y + SVG_BAR - 3, label, ms);
}

int bench_write_svg(const bench_run *run, const char *path)
{
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < run->count; i++) {
        const bench_result *r = &run->results[i];
        double v[] = {r->eager_ms, r->traced_ms, r->limit_ms};
        for (int k = 0; k < 3; k++) {
            if (!isnan(v[k]) && v[k] > 0) {
                lo = v[k] < lo ? v[k] : lo;
                hi = v[k] > hi ? v[k] : hi;
            }
        }
    }
    lo = pow(10, floor(log10(lo)) - 0.3); /* room for the shortest bar */
    hi = pow(10, ceil(log10(hi)));
    FILE *out = fopen(path, "w");
    if (!out) {
        perror(path);
        return -1;
    }
    int height = SVG_TOP + run->count * SVG_GROUP + 20;
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                 "font-size=\"11\">\n", SVG_WIDTH, height);
    fprintf(out, "  <style>.eager{fill:#9e9e9e}.traced{fill:#e8710a}.limit{fill:#1a73e8}</style>\n");
    fprintf(out, "  <text x=\"10\" y=\"18\" font-size=\"14\">kiln-bench: milliseconds per run, log scale "
                 "(shorter is faster)</text>\n");
    char machine[320];
    fprintf(out, "  <text x=\"10\" y=\"36\">%s, traced by %s; limit = bytes / %.1f GB/s %s, or "
                 "the workload's matrix products by %s alone</text>\n", machine_text(run, machine, sizeof machine),
            run->backend, run->probes.copy_gbps, on_cuda(run) ? "device copy" : "copy",
            on_cuda(run) ? "kiln_matmul" : "OpenBLAS sgemm");
    for (int i = 0; i < run->count; i++) {
        const bench_result *r = &run->results[i];
        double y = SVG_TOP + i * SVG_GROUP;
        fprintf(out, "  <g id=\"workload-%s\">\n", r->name);
        fprintf(out, "    <text x=\"10\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n", y + 24, r->name);
        fprintf(out, "    <text x=\"10\" y=\"%.0f\">%s</text>\n", y + 38, r->size);
        svg_bar(out, r->eager_ms, lo, hi, y, "eager", "eager");
        svg_bar(out, r->traced_ms, lo, hi, y + SVG_BAR + 2, "traced", "traced");
        svg_bar(out, r->limit_ms, lo, hi, y + 2 * (SVG_BAR + 2), "limit", "machine limit");
        fprintf(out, "  </g>\n");
    }
    fprintf(out, "</svg>\n");
    return fclose(out) == 0 ? 0 : -1;
}

/* -- Peers ----------------------------------------------------------------- */

static double field(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return NAN;
    return json_object_get_double(v);
}

static const char *text_field(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* The workload called name in a run's workloads, or NULL. */
static json_object *find_workload(json_object *run, const char *name)
{
    json_object *list;
    if (!json_object_object_get_ex(run, "workloads", &list) || !json_object_is_type(list, json_type_array))
        return NULL;
    for (size_t i = 0; i < json_object_array_length(list); i++) {
        json_object *w = json_object_array_get_idx(list, i);
        const char *n = text_field(w, "name");
        if (n && !strcmp(n, name))
            return w;
    }
    return NULL;
}

static void print_peer_run(const bench_run *run, json_object *peer, FILE *out)
{
    const char *system = text_field(peer, "system"), *eager = text_field(peer, "eager_label"),
               *traced = text_field(peer, "traced_label");
    fprintf(out, "\nvs %s (%s%s%s); ratios are the peer's time over kiln traced (above 1: kiln faster)\n",
            system ? system : "?", eager ? eager : "eager", traced ? ", " : "", traced ? traced : "");
    fprintf(out, "%-10s %12s %12s %12s %14s %14s\n", "workload", "kiln traced", "peer eager", "peer traced",
            "eager / kiln", "traced / kiln");
    for (int i = 0; i < run->count; i++) {
        const bench_result *r = &run->results[i];
        json_object *w = find_workload(peer, r->name);
        double pe = w ? field(w, "eager_ms") : NAN, pt = w ? field(w, "traced_ms") : NAN;
        char b[4][32];
        fprintf(out, "%-10s %12.4g %12s %12s %14s %14s\n", r->name, r->traced_ms,
                bench_number(b[0], 32, pe, "%.4g"), bench_number(b[1], 32, pt, "%.4g"),
                bench_number(b[2], 32, pe / r->traced_ms, "%.2fx"), bench_number(b[3], 32, pt / r->traced_ms, "%.2fx"));
    }
}

int bench_print_comparison(const bench_run *run, const char *path, FILE *out)
{
    json_object *root = json_object_from_file(path);
    json_object *runs;
    const char *schema = root ? text_field(root, "schema") : NULL;
    if (!root || !schema || strcmp(schema, "kiln-bench/1") ||
        !json_object_object_get_ex(root, "runs", &runs) || !json_object_is_type(runs, json_type_array)) {
        fprintf(stderr, "kiln-bench: %s is not kiln-bench/1 JSON with runs\n", path);
        json_object_put(root);
        return -1;
    }
    for (size_t i = 0; i < json_object_array_length(runs); i++)
        print_peer_run(run, json_object_array_get_idx(runs, i), out);
    json_object_put(root);
    return 0;
}
