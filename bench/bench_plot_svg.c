/*
 * bench_plot_svg.c - the SVG writer of bench_plot.h.
 *
 * Axes are linear from 0 (throughput charts read best against a zero
 * baseline) to a "nice" maximum (1, 2 or 5 times a power of ten steps),
 * so two runs' charts compare by eye. Text is XML-escaped because titles
 * carry file names.
 */
#include "bench/bench_plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 860
#define PANEL_H 280
#define LEFT 90
#define RIGHT 150
#define TOP 70
#define GAP 60
#define BOTTOM 50

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

/* A tick step of 1, 2 or 5 x 10^k giving about 5 intervals up to max. */
static double nice_step(double max)
{
    if (!(max > 0)) return 1;
    double raw = max / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void tick_label(char *buf, size_t n, double v)
{
    if (fabs(v) >= 1e6) snprintf(buf, n, "%gM", v / 1e6);
    else if (fabs(v) >= 1e4) snprintf(buf, n, "%gK", v / 1e3);
    else snprintf(buf, n, "%g", v);
}

static void panel(FILE *f, int y0, const double *x, int n, double xmax, const bench_plot_panel *p)
{
    double ymax = 0;
    for (int s = 0; s < p->n_series; s++)
        for (int i = 0; i < n; i++)
            if (isfinite(p->series[s].y[i]) && p->series[s].y[i] > ymax) ymax = p->series[s].y[i];
    double ystep = nice_step(ymax), ytop = ystep * ceil(ymax / ystep);
    if (!(ytop > 0)) ytop = ystep;
    double xstep = nice_step(xmax), xtop = xstep * ceil(xmax / xstep);
    if (!(xtop > 0)) xtop = xstep;
    int pw = W - LEFT - RIGHT;
#define PX(v) (LEFT + (v) / xtop * pw)
#define PY(v) (y0 + PANEL_H - (v) / ytop * PANEL_H)
    char lab[32];
    fprintf(f, "<g font-family=\"sans-serif\" font-size=\"12\">\n");
    for (double v = 0; v <= ytop * 1.0001; v += ystep) {
        tick_label(lab, sizeof lab, v);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", LEFT, PY(v), LEFT + pw,
                PY(v));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", LEFT - 6, PY(v) + 4, lab);
    }
    for (double v = 0; v <= xtop * 1.0001; v += xstep) {
        tick_label(lab, sizeof lab, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#f0f0f0\"/>\n", PX(v), y0, PX(v),
                y0 + PANEL_H);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", PX(v), y0 + PANEL_H + 16, lab);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", LEFT, y0, pw,
            PANEL_H);
    fprintf(f, "<text transform=\"translate(%d,%d) rotate(-90)\" text-anchor=\"middle\">", 22, y0 + PANEL_H / 2);
    esc(f, p->y_label);
    fprintf(f, "</text>\n");
    for (int s = 0; s < p->n_series; s++) {
        const bench_plot_series *se = &p->series[s];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", se->color,
                se->dashed ? " stroke-dasharray=\"6,4\"" : "");
        for (int i = 0; i < n; i++)
            if (isfinite(se->y[i]) && isfinite(x[i])) fprintf(f, "%.1f,%.1f ", PX(x[i]), PY(se->y[i]));
        fprintf(f, "\"/>\n");
        if (!se->dashed)
            for (int i = 0; i < n; i++)
                if (isfinite(se->y[i]) && isfinite(x[i]))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(x[i]), PY(se->y[i]),
                            se->color);
        int ly = y0 + 16 + 20 * s;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                LEFT + pw + 12, ly - 4, LEFT + pw + 36, ly - 4, se->color,
                se->dashed ? " stroke-dasharray=\"6,4\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">", LEFT + pw + 42, ly);
        esc(f, se->label);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n");
#undef PX
#undef PY
}

int bench_plot_svg(const char *path, const char *title, const char *subtitle, const char *x_label,
                   const double *x, int n, const bench_plot_panel *panels, int n_panels)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "ds4-bench: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    double xmax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] > xmax) xmax = x[i];
    int h = TOP + n_panels * (PANEL_H + GAP) - GAP + BOTTOM;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            W, h, W, h);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-family=\"sans-serif\" font-size=\"16\" font-weight=\"bold\">", LEFT);
    esc(f, title);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"44\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#444\">", LEFT);
    esc(f, subtitle);
    fprintf(f, "</text>\n");
    for (int p = 0; p < n_panels; p++) panel(f, TOP + p * (PANEL_H + GAP), x, n, xmax, &panels[p]);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-family=\"sans-serif\" font-size=\"12\" text-anchor=\"middle\">",
            LEFT + (W - LEFT - RIGHT) / 2, h - 12);
    esc(f, x_label);
    fprintf(f, "</text>\n</svg>\n");
    if (ferror(f) | fclose(f)) {
        fprintf(stderr, "ds4-bench: writing %s failed\n", path);
        return 1;
    }
    return 0;
}
