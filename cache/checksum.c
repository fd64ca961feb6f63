/*
 * checksum.c — the blob checksum over ISA-L's CRC-64 (checksum.h).
 */
#include "cache/checksum.h"

#include <isa-l/crc64.h>

uint64_t kiln__crc64(uint64_t crc, const void *p, size_t n)
{
	if (n == 0)
		return crc;
	return crc64_ecma_refl(crc, (const unsigned char *)p, (uint64_t)n);
}

void kiln__crc_bytes(uint64_t crc, uint8_t out[KILN__CRC_BYTES])
{
	for (int i = 0; i < KILN__CRC_BYTES; i++)
		out[i] = (uint8_t)(crc >> (8 * (KILN__CRC_BYTES - 1 - i)));
}
