/*
 * cc_check: prints the TCP congestion control a freshly created TCP socket
 * gets.  uiw-bench runs it under the same LD_PRELOAD (cc_preload.so) and the
 * same `uiw run` wrapper as the measured programs, to prove that the forced
 * congestion control really reaches their sockets before anything is timed.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void)
{
	char name[64] = { 0 };
	socklen_t len = sizeof(name) - 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) {
		perror("cc_check: socket");
		return 2;
	}
	if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len)) {
		perror("cc_check: getsockopt(TCP_CONGESTION)");
		return 2;
	}
	printf("cc=%s\n", name);
	close(fd);
	return 0;
}
