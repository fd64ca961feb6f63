/*
 * checksum.h — the blob integrity check: CRC-64 (ECMA-182, reflected, as
 * in xz) of a blob's bytes, computed by ISA-L (libisal), kept in the
 * blob's index row and checked on every read.
 *
 * SHA-256 names a blob (content addressing, dedup, `verify`); the CRC
 * guards it against bit rot, torn writes and truncation on the hot path,
 * at ~70 GB/s (ISA-L picks its PCLMUL/VPCLMUL kernel for the CPU at run
 * time) instead of SHA-256's 1.7 GB/s (cache/README.md, "Reads").
 *
 * Threads: any.
 */
#ifndef KILN_CACHE_CHECKSUM_H
#define KILN_CACHE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define KILN__CRC_BYTES 8

/* Continues crc (0 to start) over p[0..n). */
uint64_t kiln__crc64(uint64_t crc, const void *p, size_t n);
/* The big-endian bytes of a CRC, as the index keeps it, and back. */
void kiln__crc_bytes(uint64_t crc, uint8_t out[KILN__CRC_BYTES]);

#endif /* KILN_CACHE_CHECKSUM_H */
