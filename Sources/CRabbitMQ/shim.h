#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <amqp_ssl_socket.h>

// amqp_login_with_properties is variadic (the SASL arguments), which Swift cannot call; this fixes
// the PLAIN mechanism's arguments so the library's own handshake can be used.
static inline amqp_rpc_reply_t attune_login_plain(amqp_connection_state_t state, const char *vhost,
                                                  int channel_max, int frame_max, int heartbeat,
                                                  const amqp_table_t *client_properties,
                                                  const char *user, const char *password) {
  return amqp_login_with_properties(state, vhost, channel_max, frame_max, heartbeat, client_properties,
                                    AMQP_SASL_METHOD_PLAIN, user, password);
}
