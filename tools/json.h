/* json.h: the tools' one JSON writer (gmr-bench --json, gmr-compare --json).
 *
 * The library writes no JSON (snapshots are pickles, traces CSV), so the
 * writer lives with the tools that need it, on the public API only. */
#ifndef GMR_TOOLS_JSON_H
#define GMR_TOOLS_JSON_H

#include <stdio.h>

/* `s` as a JSON string: quotes, backslashes and control characters escaped
 * (\n and \t by name, the others as \u00XX). */
void tool_json_string(FILE *out, const char *s);

#endif /* GMR_TOOLS_JSON_H */
