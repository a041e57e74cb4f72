/*
 * pyjson.c - Python-compatible JSON serialization (see pyjson.h).
 *
 * Floats: Python prints the shortest digit string that reads back to the
 * same double, in fixed notation when the decimal exponent is in
 * [-4, 16) (always with a fractional part, "2.0"), otherwise as d.ddde±XX
 * with at least two exponent digits. We find the shortest digits by trying
 * %.*e precisions until strtod round-trips.
 */
#include "text/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds4_pyjson_string(ds4_strbuf *b, const char *s, size_t n)
{
    ds4_sb_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (esc) {
            ds4_sb_append(b, s + i - run, run);
            run = 0;
            ds4_sb_puts(b, esc);
        } else {
            run++;
        }
    }
    ds4_sb_append(b, s + n - run, run);
    ds4_sb_putc(b, '"');
}

void ds4_pyjson_float(ds4_strbuf *b, double x)
{
    if (isnan(x)) {
        ds4_sb_puts(b, "NaN");
        return;
    }
    if (isinf(x)) {
        ds4_sb_puts(b, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        ds4_sb_puts(b, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char e[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e[+-]XX : collect digits and exponent */
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) ds4_sb_putc(b, '-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            ds4_sb_puts(b, "0.");
            for (int i = 0; i < -exp10 - 1; i++) ds4_sb_putc(b, '0');
            ds4_sb_append(b, digits, (size_t)nd);
        } else {
            int int_digits = exp10 + 1;
            for (int i = 0; i < int_digits; i++) ds4_sb_putc(b, i < nd ? digits[i] : '0');
            ds4_sb_putc(b, '.');
            if (nd > int_digits) ds4_sb_append(b, digits + int_digits, (size_t)(nd - int_digits));
            else ds4_sb_putc(b, '0');
        }
    } else {
        ds4_sb_putc(b, digits[0]);
        if (nd > 1) {
            ds4_sb_putc(b, '.');
            ds4_sb_append(b, digits + 1, (size_t)(nd - 1));
        }
        ds4_sb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

void ds4_pyjson_dump(ds4_strbuf *b, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        ds4_sb_putc(b, '{');
        const char *key;
        json_t *val;
        bool first = true;
        json_object_foreach((json_t *)v, key, val) {
            if (!first) ds4_sb_puts(b, ", ");
            first = false;
            ds4_pyjson_string(b, key, strlen(key));
            ds4_sb_puts(b, ": ");
            ds4_pyjson_dump(b, val);
        }
        ds4_sb_putc(b, '}');
        break;
    }
    case JSON_ARRAY: {
        ds4_sb_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ds4_sb_puts(b, ", ");
            ds4_pyjson_dump(b, json_array_get(v, i));
        }
        ds4_sb_putc(b, ']');
        break;
    }
    case JSON_STRING: ds4_pyjson_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: ds4_sb_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: ds4_pyjson_float(b, json_real_value(v)); break;
    case JSON_TRUE: ds4_sb_puts(b, "true"); break;
    case JSON_FALSE: ds4_sb_puts(b, "false"); break;
    case JSON_NULL: ds4_sb_puts(b, "null"); break;
    }
}
