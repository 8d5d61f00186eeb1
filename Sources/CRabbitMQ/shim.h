#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <amqp_ssl_socket.h>
