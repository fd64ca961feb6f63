/*
 * blob.c — the blob files: names, durable writes, verified reads, the walk
 * over objects/.
 *
 * A blob lives at objects/ab/<62 hex>, named by the SHA-256 of its bytes. It
 * is written as objects/ab/.tmp.<pid>.<seq> (O_EXCL), fsync'ed, closed,
 * renamed over its name and the directory fsync'ed: a blob under its name
 * is always whole. A failed fsync is never retried (Linux may have dropped
 * the dirty pages and report success the next time): the temp file is
 * removed and the put fails. Reads check the size and the hash, so a blob
 * that rotted, was cut short or vanished is a miss, never wrong bytes.
 *
 * Threads: any; each call works on its own file descriptors.
 */
#include "cache/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_CHUNK (512u * 1024u)
/* No blob is this large (puts are capped by max_bytes, at most the
 * filesystem): a size at or above it comes from a damaged row. */
#define KILN__BLOB_SIZE_MAX (UINT64_C(1) << 48)

void kiln__hex(const uint8_t *b, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	return -1; /* upper case is not a blob name */
}

int kiln__unhex(const char *s, size_t n, uint8_t *out)
{
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

void kiln__blob_path(const kiln_cache_t *c, const uint8_t hash[32], char *out,
		     size_t outlen)
{
	/* Every read builds one: no printf. open() keeps store paths under
	 * PATH_MAX - 128, so outlen (PATH_MAX) always has room. */
	char hex[KILN__HASH_HEX];
	kiln__hex(hash, 32, hex);
	size_t n = strlen(c->objects_path);
	if (n + 2 + 64 + 1 > outlen) {
		snprintf(out, outlen, "%s", c->objects_path);
		return;
	}
	memcpy(out, c->objects_path, n);
	out[n] = '/';
	memcpy(out + n + 1, hex, 2);
	out[n + 3] = '/';
	memcpy(out + n + 4, hex + 2, 63); /* 62 digits and the NUL */
}

void kiln__sha256(const kiln_cache_t *c, const void *p, size_t n,
		  uint8_t out[32])
{
	unsigned int len = 32;
	/* EVP_Digest with a fetched EVP_MD cannot fail short of OOM inside
	 * OpenSSL; then the zero hash simply names no blob. */
	if (!EVP_Digest(p, n, out, &len, c->sha256, NULL))
		memset(out, 0, 32);
}

static int fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

/* objects/ab exists (created and made durable when new). */
static int ensure_subdir(kiln_cache_t *c, const char *sub, char *err,
			 size_t errlen)
{
	if (mkdir(sub, 0755) == 0) {
		if (!c->opts.no_fsync) {
			int rc = fsync_dir(c->objects_path);
			if (rc < 0)
				return kiln__errf(
				    err, errlen, rc, "fsync %s: %s",
				    c->objects_path, kiln_strerror(rc));
		}
		return 0;
	}
	if (errno == EEXIST)
		return 0;
	int rc = -errno;
	return kiln__errf(err, errlen, rc, "mkdir %s: %s", sub,
			  kiln_strerror(rc));
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int kiln__blob_write(kiln_cache_t *c, const uint8_t hash[32], const void *bytes,
		     size_t n, bool *named, char *err, size_t errlen)
{
	*named = false;
	char final[PATH_MAX], sub[PATH_MAX], tmp[PATH_MAX + 64];
	kiln__blob_path(c, hash, final, sizeof(final));
	size_t dirlen = strlen(final) - 63; /* strip "/<62 hex>" */
	memcpy(sub, final, dirlen);
	sub[dirlen] = '\0';
	int rc = ensure_subdir(c, sub, err, errlen);
	if (rc < 0)
		return rc;
	uint64_t seq = atomic_fetch_add(&c->tmp_seq, 1);
	snprintf(tmp, sizeof(tmp), "%s/.tmp.%ld.%llu", sub, (long)getpid(),
		 (unsigned long long)seq);

	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		return kiln__errf(err, errlen, rc, "create %s: %s", tmp,
				  kiln_strerror(rc));
	}
	const char *step = "write";
	rc = write_all(fd, bytes, n);
	if (rc == 0 && !c->opts.no_fsync && fsync(fd) < 0) {
		rc = -errno;
		step = "fsync";
	}
	if (close(fd) < 0 && rc == 0) {
		rc = -errno;
		step = "close";
	}
	if (rc == 0 && rename(tmp, final) < 0) {
		rc = -errno;
		step = "rename";
	}
	if (rc < 0) {
		unlink(tmp);
		return kiln__errf(err, errlen, rc, "%s %s: %s", step, tmp,
				  kiln_strerror(rc));
	}
	*named = true;
	if (!c->opts.no_fsync) {
		rc = fsync_dir(sub);
		if (rc < 0) /* the name may not be durable: the put fails */
			return kiln__errf(err, errlen, rc, "fsync %s: %s", sub,
					  kiln_strerror(rc));
	}
	return 0;
}

/* Reads a blob (into *out when out is not NULL) and checks it: with crc,
 * against that CRC-64; without, against the SHA-256 in its name, also
 * computing its CRC-64 into crc_out when that is not NULL. The size comes
 * from the index, so there is no fstat: the first read asks for one byte
 * more than the blob should have, and a regular file that returns exactly
 * the size has ended (Linux does not cut a page-cache read short for a
 * signal it survives). Each chunk read is hashed while it is still in the
 * CPU cache. */
static int read_verify(kiln_cache_t *c, const uint8_t hash[32], uint64_t size,
		       const uint8_t *crc, uint8_t *crc_out, uint8_t **out,
		       char *err, size_t errlen)
{
	char path[PATH_MAX];
	kiln__blob_path(c, hash, path, sizeof(path));
	if (size >= KILN__BLOB_SIZE_MAX) { /* a damaged row, not a blob */
		kiln__errf(err, errlen, 0, "%s: the index says %llu bytes",
			   path, (unsigned long long)size);
		return KILN__BLOB_BAD;
	}
	/* O_NONBLOCK: a FIFO planted under a blob name fails, not blocks. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
				O_NOCTTY);
	if (fd < 0) {
		int e = errno;
		kiln__errf(err, errlen, KILN__BLOB_BAD, "open %s: %s", path,
			   strerror(e));
		return (e == ENOENT || e == ENOTDIR || e == ELOOP)
			   ? KILN__BLOB_BAD
			   : KILN__BLOB_IOERR;
	}
	bool whole = out != NULL;
	/* a check without the bytes reads through one chunk-sized buffer,
	 * no larger than the blob (a dedup check on put reads small blobs) */
	size_t cap =
	    whole || size < READ_CHUNK ? (size_t)size + 1 : READ_CHUNK + 1;
	uint8_t *buf = malloc(cap);
	EVP_MD_CTX *md = crc == NULL ? EVP_MD_CTX_new() : NULL;
	if (buf == NULL ||
	    (crc == NULL &&
	     (md == NULL || !EVP_DigestInit_ex(md, c->sha256, NULL)))) {
		free(buf);
		EVP_MD_CTX_free(md);
		close(fd);
		return -ENOMEM;
	}
	uint64_t sum = 0; /* the CRC-64 so far */
	uint64_t got = 0;
	int rc = KILN__BLOB_OK;
	const char *why = NULL;
	for (;;) {
		/* Up to one chunk, and one byte past the expected end. */
		uint64_t left = size + 1 - got;
		size_t want = left > READ_CHUNK + 1 ? READ_CHUNK : (size_t)left;
		uint8_t *dst = whole ? buf + got : buf;
		ssize_t r = read(fd, dst, want);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			/* A directory, FIFO or socket under a blob name. */
			rc = (e == EISDIR || e == EAGAIN || e == EINVAL)
				 ? KILN__BLOB_BAD
				 : KILN__BLOB_IOERR;
			why = strerror(e);
			break;
		}
		if (r == 0)
			break;
		if (got + (uint64_t)r > size) {
			rc = KILN__BLOB_BAD;
			why = "longer than the index says";
			break;
		}
		if (md != NULL)
			EVP_DigestUpdate(md, dst, (size_t)r);
		sum = kiln__crc64(sum, dst, (size_t)r);
		got += (uint64_t)r;
		if (got == size && (size_t)r < want)
			break; /* asked for one byte more: the end */
	}
	if (rc == KILN__BLOB_OK && got != size) {
		rc = KILN__BLOB_BAD;
		why = "shorter than the index says";
	}
	if (rc != KILN__BLOB_OK) {
		kiln__errf(err, errlen, 0, "read %s: %s", path, why);
	} else {
		uint8_t sb[KILN__CRC_BYTES];
		kiln__crc_bytes(sum, sb);
		if (crc != NULL) {
			if (memcmp(sb, crc, KILN__CRC_BYTES) != 0) {
				rc = KILN__BLOB_BAD;
				kiln__errf(err, errlen, 0,
					   "%s: checksum mismatch", path);
			}
		} else {
			uint8_t digest[32];
			unsigned int dlen = 32;
			EVP_DigestFinal_ex(md, digest, &dlen);
			if (memcmp(digest, hash, 32) != 0) {
				rc = KILN__BLOB_BAD;
				kiln__errf(err, errlen, 0,
					   "%s: SHA-256 mismatch", path);
			} else if (crc_out != NULL) {
				memcpy(crc_out, sb, KILN__CRC_BYTES);
			}
		}
	}
	EVP_MD_CTX_free(md);
	close(fd);
	if (rc == KILN__BLOB_OK && out != NULL) {
		*out = buf;
		return KILN__BLOB_OK;
	}
	free(buf);
	return rc;
}

int kiln__blob_read(kiln_cache_t *c, const uint8_t hash[32], uint64_t size,
		    const uint8_t *crc, uint8_t *crc_out, uint8_t **out,
		    char *err, size_t errlen)
{
	*out = NULL;
	return read_verify(c, hash, size, crc, crc_out, out, err, errlen);
}

int kiln__blob_check(kiln_cache_t *c, const uint8_t hash[32], uint64_t size,
		     const uint8_t *crc, uint8_t *crc_out)
{
	return read_verify(c, hash, size, crc, crc_out, NULL, NULL, 0);
}

void kiln__blob_unlink(kiln_cache_t *c, const uint8_t hash[32])
{
	char path[PATH_MAX];
	kiln__blob_path(c, hash, path, sizeof(path));
	if (unlink(path) < 0 && errno != ENOENT)
		KILN_LOG(KILN_LOG_WARN,
			 "msg=\"cannot remove blob\" path=%s err=%s", path,
			 strerror(errno));
}

int kiln__objects_walk(kiln_cache_t *c,
		       int (*fn)(const uint8_t hash[32], const char *path,
				 uint64_t size, void *arg),
		       void *arg)
{
	DIR *top = opendir(c->objects_path);
	if (top == NULL)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *d;
	int rc = 0;
	while (rc == 0 && (d = readdir(top)) != NULL) {
		uint8_t first;
		if (strlen(d->d_name) != 2 || kiln__unhex(d->d_name, 1, &first))
			continue;
		char sub[PATH_MAX];
		snprintf(sub, sizeof(sub), "%s/%s", c->objects_path, d->d_name);
		DIR *dir = opendir(sub);
		if (dir == NULL)
			continue;
		struct dirent *f;
		while (rc == 0 && (f = readdir(dir)) != NULL) {
			char path[PATH_MAX + 260];
			snprintf(path, sizeof(path), "%s/%s", sub, f->d_name);
			if (strncmp(f->d_name, ".tmp.", 5) == 0) {
				if (unlink(path) == 0)
					KILN__COUNT(c, temp_removed, 1);
				continue;
			}
			uint8_t hash[32];
			hash[0] = first;
			if (strlen(f->d_name) != 62 ||
			    kiln__unhex(f->d_name, 31, hash + 1))
				continue;
			struct stat st;
			if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
				continue;
			rc = fn(hash, path, (uint64_t)st.st_size, arg);
		}
		closedir(dir);
	}
	closedir(top);
	return rc;
}
