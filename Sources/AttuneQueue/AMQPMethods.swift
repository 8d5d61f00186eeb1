internal import CRabbitMQ
import Foundation

/// AMQP method numbers (class << 16 | method). rabbitmq-c defines them as cast macros, which Swift
/// does not import.
enum Method {
    static let connectionClose: amqp_method_number_t = 0x000A_0032
    static let connectionCloseOk: amqp_method_number_t = 0x000A_0033
    static let channelClose: amqp_method_number_t = 0x0014_0028
    static let channelCloseOk: amqp_method_number_t = 0x0014_0029
    static let basicCancel: amqp_method_number_t = 0x003C_001E
    static let basicReturn: amqp_method_number_t = 0x003C_0032
    static let basicDeliver: amqp_method_number_t = 0x003C_003C
    static let basicAck: amqp_method_number_t = 0x003C_0050
    static let basicNack: amqp_method_number_t = 0x003C_0078
}

extension amqp_basic_properties_t {
    func flag(_ flag: Int32) -> Bool { _flags & amqp_flags_t(flag) != 0 }
}

extension timeval {
    init(interval: TimeInterval) {
        let whole = Int(interval.rounded(.down))
        self.init(tv_sec: time_t(whole), tv_usec: suseconds_t(((interval - Double(whole)) * 1_000_000).rounded(.down)))
    }
}
