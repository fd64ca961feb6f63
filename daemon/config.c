/*
 * config.c — kilnd's settings (config.h): the defaults of the KILND_SETTINGS
 * X-macro, then the INI file, then KILN_<NAME> environment variables, then
 * the command line, each overriding the one before.
 *
 * Invariants:
 *   - a STR field holds either its default (the string literal in
 *     `settings` below, never freed) or a malloc'd copy that the struct
 *     owns; kilnd_config_free() tells them apart by address. So
 *     kilnd_config_defaults() allocates nothing and cannot fail, and a
 *     struct in any state this file leaves it in can be freed. Code outside
 *     this file must not free or replace a STR field by hand (moving a
 *     pointer from one struct to another and setting the source to NULL is
 *     fine);
 *   - src_* point to static strings or to cfg->config_path;
 *   - a failed kilnd_config_load() leaves cfg at the defaults.
 *
 * The file is read with inih through our own line reader: it counts lines
 * (inih's handler gets no line number here), strips leading blanks (so an
 * indented line is never taken for an inih continuation line), checks
 * section headers (only [kilnd]), and rejects lines too long for inih's
 * buffer instead of letting inih split them.
 *
 * Threads: no mutable globals; distinct structs may be used from distinct
 * threads. kilnd_config_load() reads the environment with getenv(): nothing
 * may call setenv() meanwhile.
 */
#include "daemon/config.h"

#include "protocol/protocol.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CONFIG_PATH "/etc/kiln/kilnd.conf"
#define SECTION		    "kilnd"
#define WIDTH		    80

static const char SRC_DEFAULT[] = "default";
static const char SRC_ENV[] = "env";
static const char SRC_CLI[] = "cli";

/* ---- the settings table -------------------------------------------------- */

typedef enum { T_STR, T_U64, T_U32, T_BOOL } type_t;

typedef struct {
	const char *name;
	type_t type;
	bool reloadable;
	const char *def_str; /* STR: the default, also the "not owned" mark */
	uint64_t def_num;    /* U64, U32, BOOL */
	const char *doc;
	size_t off;	/* of the value in kilnd_config_t */
	size_t src_off; /* of src_<name> */
} setting_t;

#define DEF_STR(d)  .def_str = (d)
#define DEF_U64(d)  .def_num = (d)
#define DEF_U32(d)  .def_num = (d)
#define DEF_BOOL(d) .def_num = (d) ? 1 : 0
#define ROW(name_, type_, def_, reload_, doc_)                                 \
	{.name = #name_,                                                       \
	 .type = T_##type_,                                                    \
	 .reloadable = (reload_),                                              \
	 DEF_##type_(def_),                                                    \
	 .doc = (doc_),                                                        \
	 .off = offsetof(kilnd_config_t, name_),                               \
	 .src_off = offsetof(kilnd_config_t, src_##name_)},

static const setting_t settings[] = {KILND_SETTINGS(ROW)};

#undef ROW
#undef DEF_STR
#undef DEF_U64
#undef DEF_U32
#undef DEF_BOOL

#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

static char **str_at(kilnd_config_t *cfg, const setting_t *s)
{
	return (char **)((char *)cfg + s->off);
}

static const char **src_at(kilnd_config_t *cfg, const setting_t *s)
{
	return (const char **)((char *)cfg + s->src_off);
}

/* Names match with '-' and '_' taken as the same character. */
static bool name_eq(const char *a, size_t alen, const char *b)
{
	size_t i;
	for (i = 0; i < alen && b[i] != '\0'; i++) {
		char x = a[i] == '-' ? '_' : a[i];
		char y = b[i] == '-' ? '_' : b[i];
		if (x != y)
			return false;
	}
	return i == alen && b[i] == '\0';
}

static const setting_t *find_setting(const char *name, size_t len)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (name_eq(name, len, settings[i].name))
			return &settings[i];
	return NULL;
}

/* ---- values -------------------------------------------------------------- */

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/*
 * Parses a decimal number with an optional k/K/M/G/T suffix (powers of
 * 1024) and optional blanks around it. 0, or -EINVAL with *why set.
 * Internal (the unit tests call it); no header declares it.
 */
int kilnd__config_parse_u64(const char *s, uint64_t max, uint64_t *out,
			    const char **why);
int kilnd__config_parse_u64(const char *s, uint64_t max, uint64_t *out,
			    const char **why)
{
	while (is_blank(*s))
		s++;
	if (*s == '-') {
		*why = "negative numbers are not allowed";
		return -EINVAL;
	}
	if (*s < '0' || *s > '9') {
		*why = "not a number";
		return -EINVAL;
	}
	uint64_t v = 0;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10) {
			*why = "too large";
			return -EINVAL;
		}
		v = v * 10 + d;
	}
	unsigned shift = 0;
	switch (*s) {
	case 'k':
	case 'K': shift = 10; break;
	case 'M': shift = 20; break;
	case 'G': shift = 30; break;
	case 'T': shift = 40; break;
	default: break;
	}
	if (shift != 0)
		s++;
	while (is_blank(*s))
		s++;
	if (*s != '\0') {
		*why = "not a number (suffixes: k, K, M, G, T)";
		return -EINVAL;
	}
	if (v > (max >> shift)) {
		*why = "too large";
		return -EINVAL;
	}
	*out = v << shift;
	return 0;
}

static bool word_eq(const char *s, size_t len, const char *w)
{
	return strlen(w) == len && strncasecmp(s, w, len) == 0;
}

/*
 * Parses true/false/yes/no/on/off/1/0 (any case, blanks around allowed).
 * 0 or -EINVAL. Internal (the unit tests call it); no header declares it.
 */
int kilnd__config_parse_bool(const char *s, bool *out);
int kilnd__config_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};
	while (is_blank(*s))
		s++;
	size_t len = strlen(s);
	while (len > 0 && is_blank(s[len - 1]))
		len--;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (word_eq(s, len, yes[i])) {
			*out = true;
			return 0;
		}
		if (word_eq(s, len, no[i])) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

int kilnd_config_log_level(const char *name)
{
	static const char *const names[] = {
	    [KILN_LOG_ERROR] = "error",
	    [KILN_LOG_WARN] = "warn",
	    [KILN_LOG_INFO] = "info",
	    [KILN_LOG_DEBUG] = "debug",
	};
	if (name == NULL)
		return -1;
	for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

/* A parsed value, not yet stored. str points into the caller's text. */
typedef struct {
	const char *str;
	uint64_t num;
} value_t;

/*
 * Parses text as the value of s. where names the origin for the message
 * ("kilnd.conf:3", "option --workers"). 0 or -EINVAL (message in err).
 */
static int parse_value(const setting_t *s, const char *text, value_t *v,
		       const char *where, char *err, size_t errlen)
{
	const char *why = NULL;
	bool b;
	v->str = text;
	v->num = 0;
	switch (s->type) {
	case T_STR:
		if (strcmp(s->name, "log_level") == 0 &&
		    kilnd_config_log_level(text) < 0)
			why = "not one of error, warn, info, debug";
		break;
	case T_U64:
		if (kilnd__config_parse_u64(text, UINT64_MAX, &v->num, &why) ==
		    0)
			why = NULL;
		break;
	case T_U32:
		if (kilnd__config_parse_u64(text, UINT32_MAX, &v->num, &why) ==
		    0)
			why = NULL;
		break;
	case T_BOOL:
		if (kilnd__config_parse_bool(text, &b) == 0)
			v->num = b;
		else
			why = "not one of true, false, yes, no, on, off, 1, 0";
		break;
	}
	if (why == NULL)
		return 0;
	if (strcmp(why, "too large") == 0)
		return kiln__errf(err, errlen, -EINVAL,
				  "%s: bad value \"%.64s\" for %s: too large "
				  "(at most %" PRIu64 ")",
				  where, text, s->name,
				  s->type == T_U32 ? (uint64_t)UINT32_MAX
						   : UINT64_MAX);
	return kiln__errf(err, errlen, -EINVAL,
			  "%s: bad value \"%.64s\" for %s: %s", where, text,
			  s->name, why);
}

static void set_str(kilnd_config_t *cfg, const setting_t *s, char *p)
{
	char **field = str_at(cfg, s);
	if (*field != NULL && *field != s->def_str)
		free(*field);
	*field = p;
}

/* Stores v into cfg with source src. 0 or -ENOMEM. */
static int store_value(kilnd_config_t *cfg, const setting_t *s,
		       const value_t *v, const char *src)
{
	char *base = (char *)cfg + s->off;
	switch (s->type) {
	case T_STR: {
		char *p = strdup(v->str);
		if (p == NULL)
			return -ENOMEM;
		set_str(cfg, s, p);
		break;
	}
	case T_U64: *(uint64_t *)(void *)base = v->num; break;
	case T_U32: *(uint32_t *)(void *)base = (uint32_t)v->num; break;
	case T_BOOL: *(bool *)(void *)base = v->num != 0; break;
	}
	*src_at(cfg, s) = src;
	return 0;
}

/* ---- defaults, free ------------------------------------------------------ */

void kilnd_config_defaults(kilnd_config_t *cfg)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		const setting_t *s = &settings[i];
		char *base = (char *)cfg + s->off;
		switch (s->type) {
		case T_STR: *(char **)(void *)base = (char *)s->def_str; break;
		case T_U64: *(uint64_t *)(void *)base = s->def_num; break;
		case T_U32:
			*(uint32_t *)(void *)base = (uint32_t)s->def_num;
			break;
		case T_BOOL: *(bool *)(void *)base = s->def_num != 0; break;
		}
		*src_at(cfg, s) = SRC_DEFAULT;
	}
	cfg->config_path = NULL;
}

void kilnd_config_free(kilnd_config_t *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < NSETTINGS; i++)
		if (settings[i].type == T_STR)
			set_str(cfg, &settings[i], NULL);
	free(cfg->config_path);
	kilnd_config_defaults(cfg);
}

/* ---- the command line ---------------------------------------------------- */

/*
 * Walks argv[1..argc). Flags go into cli (if not NULL); setting options are
 * checked and, if cfg is not NULL, stored with source "cli".
 */
static int walk_argv(int argc, char **argv, kilnd_cli_t *cli,
		     kilnd_config_t *cfg, char *err, size_t errlen)
{
	for (int i = 1; i < argc && argv[i] != NULL; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0) {
			if (cli != NULL)
				cli->help = true;
			continue;
		}
		if (strcmp(a, "-V") == 0) {
			if (cli != NULL)
				cli->version = true;
			continue;
		}
		if (strncmp(a, "--", 2) != 0 || a[2] == '\0' || a[2] == '=')
			return kiln__errf(err, errlen, -EINVAL,
					  "unexpected argument \"%.64s\" (see "
					  "--help)",
					  a);
		const char *name = a + 2;
		const char *eq = strchr(name, '=');
		size_t nlen = eq != NULL ? (size_t)(eq - name) : strlen(name);
		const char *val = eq != NULL ? eq + 1 : NULL;
		int shown = nlen > 64 ? 64 : (int)nlen;

		bool *flag = NULL, scratch = false;
		if (name_eq(name, nlen, "help"))
			flag = cli != NULL ? &cli->help : &scratch;
		else if (name_eq(name, nlen, "version"))
			flag = cli != NULL ? &cli->version : &scratch;
		else if (name_eq(name, nlen, "check_config"))
			flag = cli != NULL ? &cli->check_config : &scratch;
		if (flag != NULL) {
			if (val != NULL)
				return kiln__errf(err, errlen, -EINVAL,
						  "option --%.*s takes no "
						  "value",
						  shown, name);
			*flag = true;
			continue;
		}

		bool is_config = name_eq(name, nlen, "config");
		const setting_t *s =
		    is_config ? NULL : find_setting(name, nlen);
		if (!is_config && s == NULL)
			return kiln__errf(err, errlen, -EINVAL,
					  "unknown option --%.*s (see --help)",
					  shown, name);
		if (val == NULL) {
			/* --name value; a following option is not a value
			 * (write --name=--x for that). */
			if (i + 1 >= argc || argv[i + 1] == NULL ||
			    strncmp(argv[i + 1], "--", 2) == 0)
				return kiln__errf(err, errlen, -EINVAL,
						  "option --%.*s needs a value",
						  shown, name);
			val = argv[++i];
		}
		if (is_config) {
			if (val[0] == '\0')
				return kiln__errf(err, errlen, -EINVAL,
						  "option --config: empty "
						  "path");
			if (cli != NULL)
				cli->config_path = val;
			continue;
		}
		char where[80];
		snprintf(where, sizeof(where), "option --%.*s", shown, name);
		value_t v;
		int rc = parse_value(s, val, &v, where, err, errlen);
		if (rc == 0 && cfg != NULL)
			rc = store_value(cfg, s, &v, SRC_CLI);
		if (rc == -ENOMEM)
			kiln__errf(err, errlen, rc, "out of memory");
		if (rc != 0)
			return rc;
	}
	return 0;
}

int kilnd_cli_parse(int argc, char **argv, kilnd_cli_t *cli, char *err,
		    size_t errlen)
{
	memset(cli, 0, sizeof(*cli));
	if (err != NULL && errlen > 0)
		err[0] = '\0';
	return walk_argv(argc, argv, cli, NULL, err, errlen);
}

/* ---- the file ------------------------------------------------------------ */

typedef struct {
	kilnd_config_t *cfg;
	FILE *f;
	const char *path;
	int line; /* of the last line handed to inih */
	int rc;	  /* the first error (message in err), or 0 */
	int rc_line;
	char *err;
	size_t errlen;
} parse_t;

static int parse_fail(parse_t *p, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first error, "path:line: what". Returns 0 (for inih). */
static int parse_fail(parse_t *p, int rc, const char *fmt, ...)
{
	if (p->rc == 0) {
		char what[200];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
		p->rc = kiln__errf(p->err, p->errlen, rc, "%s:%d: %s", p->path,
				   p->line, what);
		p->rc_line = p->line;
	}
	return 0;
}

/*
 * inih's line reader (fgets-like): one line without its newline, leading
 * blanks and a UTF-8 BOM removed; NULL at the end or after an error.
 */
static char *read_line(char *buf, int num, void *stream)
{
	parse_t *p = stream;
	if (p->rc != 0)
		return NULL;
	size_t n = 0;
	int ch = EOF;
	bool any = false;
	p->line++;
	while ((ch = getc(p->f)) != EOF) {
		any = true;
		if (ch == '\n')
			break;
		if (ch == '\0') {
			parse_fail(p, -EINVAL, "NUL byte in the line");
			return NULL;
		}
		if (n + 1 >= (size_t)num) {
			parse_fail(p, -EINVAL, "line longer than %d characters",
				   num - 2);
			return NULL;
		}
		buf[n++] = (char)ch;
	}
	if (ch == EOF && ferror(p->f)) {
		int e = errno != 0 ? errno : EIO;
		parse_fail(p, -e, "read error: %s", kiln_strerror(-e));
		return NULL;
	}
	if (!any) {
		p->line--;
		return NULL;
	}
	buf[n] = '\0';
	size_t skip = 0;
	if (p->line == 1 && n >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
		skip = 3;
	while (skip < n && (buf[skip] == ' ' || buf[skip] == '\t'))
		skip++;
	memmove(buf, buf + skip, n - skip + 1);
	n -= skip;

	if (buf[0] == '[') {
		const char *end = strchr(buf, ']');
		if (end != NULL) { /* else inih reports the syntax error */
			const char *b = buf + 1;
			while (b < end && is_blank(*b))
				b++;
			const char *e = end;
			while (e > b && is_blank(e[-1]))
				e--;
			if ((size_t)(e - b) != strlen(SECTION) ||
			    memcmp(b, SECTION, strlen(SECTION)) != 0) {
				char name[72];
				snprintf(name, sizeof(name), "%.*s",
					 (int)(end - buf - 1 > 64
						   ? 64
						   : end - buf - 1),
					 buf + 1);
				parse_fail(p, -EINVAL,
					   "unknown section [%s] (the only "
					   "section is [" SECTION "])",
					   name);
				return NULL;
			}
		}
	}
	return buf;
}

static int on_pair(void *user, const char *section, const char *name,
		   const char *value)
{
	parse_t *p = user;
	(void)section; /* checked by read_line */
	if (p->rc != 0)
		return 0;
	const setting_t *s = find_setting(name, strlen(name));
	if (s == NULL)
		return parse_fail(p, -EINVAL, "unknown setting \"%.64s\"",
				  name);
	size_t len = strlen(value);
	if (len >= 2 && (value[0] == '"' || value[0] == '\'') &&
	    value[len - 1] == value[0]) {
		value++;
		len -= 2;
	}
	char *text = strndup(value, len);
	if (text == NULL)
		return parse_fail(p, -ENOMEM, "out of memory");
	char where[300];
	snprintf(where, sizeof(where), "%s:%d", p->path, p->line);
	value_t v;
	int rc = parse_value(s, text, &v, where, p->err, p->errlen);
	if (rc == 0) {
		rc = store_value(p->cfg, s, &v, p->cfg->config_path);
		if (rc != 0)
			parse_fail(p, rc, "out of memory");
	} else {
		p->rc = rc;
		p->rc_line = p->line;
	}
	free(text);
	return rc == 0;
}

/* Reads path into cfg. A missing file is an error only when explicit. */
static int read_file(kilnd_config_t *cfg, const char *path, bool explicit,
		     char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (f == NULL) {
		int e = errno;
		if (e == ENOENT && !explicit)
			return 0;
		return kiln__errf(err, errlen, -e, "config file %s: %s", path,
				  kiln_strerror(-e));
	}
	cfg->config_path = strdup(path);
	if (cfg->config_path == NULL) {
		fclose(f);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	parse_t p = {
	    .cfg = cfg,
	    .f = f,
	    .path = cfg->config_path,
	    .err = err,
	    .errlen = errlen,
	};
	int rc = ini_parse_stream(read_line, &p, on_pair, &p);
	fclose(f);
	if (rc > 0 && (p.rc == 0 || rc < p.rc_line))
		return kiln__errf(err, errlen, -EINVAL,
				  "%s:%d: syntax error (expected [" SECTION
				  "], name = value, or a # comment)",
				  path, rc);
	if (p.rc != 0)
		return p.rc;
	if (rc == -2)
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	if (rc != 0)
		return kiln__errf(err, errlen, -EIO, "%s: cannot parse", path);
	return 0;
}

/* ---- the environment ----------------------------------------------------- */

static int read_env(kilnd_config_t *cfg, char *err, size_t errlen)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		const setting_t *s = &settings[i];
		char var[64] = "KILN_";
		size_t n = strlen(var);
		for (const char *c = s->name; *c != '\0' && n + 1 < sizeof(var);
		     c++)
			var[n++] =
			    (*c >= 'a' && *c <= 'z') ? (char)(*c - 32) : *c;
		var[n] = '\0';
		const char *text = getenv(var);
		if (text == NULL || text[0] == '\0')
			continue; /* set but empty: as if unset */
		char where[80];
		snprintf(where, sizeof(where), "environment %s", var);
		value_t v;
		int rc = parse_value(s, text, &v, where, err, errlen);
		if (rc == 0)
			rc = store_value(cfg, s, &v, SRC_ENV);
		if (rc == -ENOMEM)
			kiln__errf(err, errlen, rc, "out of memory");
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* ---- load ---------------------------------------------------------------- */

int kilnd_config_load(kilnd_config_t *cfg, const kilnd_cli_t *cli, int argc,
		      char **argv, char *err, size_t errlen)
{
	kilnd_config_free(cfg); /* and back to the defaults */
	if (err != NULL && errlen > 0)
		err[0] = '\0';

	const char *path = cli != NULL ? cli->config_path : NULL;
	bool explicit = path != NULL;
	if (path == NULL) {
		const char *env = getenv("KILN_CONFIG");
		if (env != NULL && env[0] != '\0') {
			path = env;
			explicit = true;
		}
	}
	if (path == NULL)
		path = DEFAULT_CONFIG_PATH;

	int rc = read_file(cfg, path, explicit, err, errlen);
	if (rc == 0)
		rc = read_env(cfg, err, errlen);
	if (rc == 0)
		rc = walk_argv(argc, argv, NULL, cfg, err, errlen);
	if (rc != 0)
		kilnd_config_free(cfg);
	return rc;
}

/* ---- output -------------------------------------------------------------- */

/* Formats the value of s in cfg into buf[32] or returns the string. */
static const char *value_text(const kilnd_config_t *cfg, const setting_t *s,
			      char buf[32])
{
	const char *base = (const char *)cfg + s->off;
	switch (s->type) {
	case T_STR: {
		const char *v = *(char *const *)(const void *)base;
		return v != NULL ? v : "";
	}
	case T_U64:
		snprintf(buf, 32, "%" PRIu64,
			 *(const uint64_t *)(const void *)base);
		return buf;
	case T_U32:
		snprintf(buf, 32, "%" PRIu32,
			 *(const uint32_t *)(const void *)base);
		return buf;
	case T_BOOL:
		return *(const bool *)(const void *)base ? "true" : "false";
	}
	return "";
}

void kilnd_config_each(const kilnd_config_t *cfg,
		       void (*fn)(const char *name, const char *value,
				  const char *source, const char *doc,
				  void *arg),
		       void *arg)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		const setting_t *s = &settings[i];
		char buf[32];
		const char *src =
		    *(const char *const *)(const void *)((const char *)cfg +
							 s->src_off);
		fn(s->name, value_text(cfg, s, buf),
		   src != NULL ? src : SRC_DEFAULT, s->doc, arg);
	}
}

/*
 * Writes text word by word, lines at most WIDTH wide: the first indented by
 * first, the others by rest.
 */
static void wrap(FILE *f, int first, int rest, const char *text)
{
	int indent = first;
	int col = 0;
	const char *w = text;
	while (*w != '\0') {
		while (*w == ' ')
			w++;
		if (*w == '\0')
			break;
		int len = (int)strcspn(w, " ");
		if (col > 0 && col + 1 + len > WIDTH) {
			fputc('\n', f);
			col = 0;
			indent = rest;
		}
		if (col == 0)
			col = fprintf(f, "%*s%.*s", indent, "", len, w);
		else
			col += fprintf(f, " %.*s", len, w);
		w += len;
	}
	if (col > 0)
		fputc('\n', f);
}

void kilnd_config_usage(FILE *f)
{
	fputs("Usage: kilnd [--config PATH] [--NAME=VALUE]...\n"
	      "       kilnd --check-config [--config PATH] [--NAME=VALUE]...\n"
	      "       kilnd --help | --version\n\n",
	      f);
	wrap(f, 0, 0,
	     "kilnd, kiln's compile daemon. Each setting comes from the "
	     "config file (section [" SECTION "]), then the environment "
	     "variable KILN_<NAME>, then the command line; each overrides "
	     "the one before.");
	fputs("\nOptions:\n"
	      "  --config PATH   read settings from PATH (also $KILN_CONFIG);\n"
	      "                  default " DEFAULT_CONFIG_PATH
	      ", if it exists\n"
	      "  --check-config  load the settings, print each with its "
	      "source, and exit\n"
	      "  -h, --help      print this help and exit\n"
	      "  -V, --version   print the version and exit\n\n",
	      f);
	wrap(f, 0, 0,
	     "Settings (--name=VALUE or --name VALUE; dashes or underscores; "
	     "N takes a k, M, G or T suffix, powers of 1024; \"reloadable\" "
	     "settings change on SIGHUP):");
	for (size_t i = 0; i < NSETTINGS; i++) {
		const setting_t *s = &settings[i];
		char opt[64], env[64], line[256];
		size_t n;
		for (n = 0; s->name[n] != '\0' && n + 1 < sizeof(opt); n++) {
			char c = s->name[n];
			opt[n] = c == '_' ? '-' : c;
			env[n] = (c >= 'a' && c <= 'z') ? (char)(c - 32) : c;
		}
		opt[n] = env[n] = '\0';
		const char *meta = "N";
		char def[40];
		switch (s->type) {
		case T_STR:
			meta = "TEXT";
			snprintf(def, sizeof(def), "\"%.30s\"", s->def_str);
			break;
		case T_BOOL:
			meta = "BOOL";
			snprintf(def, sizeof(def), "%s",
				 s->def_num ? "true" : "false");
			break;
		default:
			snprintf(def, sizeof(def), "%" PRIu64, s->def_num);
			break;
		}
		snprintf(line, sizeof(line), "--%s=%s (KILN_%s; default %s%s)",
			 opt, meta, env, def,
			 s->reloadable ? "; reloadable" : "");
		wrap(f, 2, 6, line);
		wrap(f, 6, 6, s->doc);
	}
}
