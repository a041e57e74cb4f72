/*
 * bench_plot.h - a small hand-written SVG line chart for ds4-bench
 * (--plot): one shared x axis, panels stacked vertically, each with its
 * own linear y axis from 0 and a legend. No plotting library is needed
 * and the file is a few KiB of plain, well-formed XML.
 */
#ifndef DS4_BENCH_BENCH_PLOT_H
#define DS4_BENCH_BENCH_PLOT_H

typedef struct {
    const char *label;
    const char *color; /* CSS colour, e.g. "#d62728" */
    const double *y;   /* n values; non-finite ones are skipped */
    int dashed;        /* a reference line (no markers) */
} bench_plot_series;

typedef struct {
    const char *y_label;
    const bench_plot_series *series;
    int n_series;
} bench_plot_panel;

/* Write the chart; 0 on success, 1 (message printed) on failure. */
int bench_plot_svg(const char *path, const char *title, const char *subtitle, const char *x_label,
                   const double *x, int n, const bench_plot_panel *panels, int n_panels);

#endif
