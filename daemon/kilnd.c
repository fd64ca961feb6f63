/*
 * kilnd.c — main(): everything is in server.c (kilnd_run) so that the
 * tests link the same code.
 */
#include "daemon/server.h"

int main(int argc, char **argv)
{
	return kilnd_run(argc, argv);
}
