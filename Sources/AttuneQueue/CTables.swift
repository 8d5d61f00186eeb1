internal import CRabbitMQ
import Foundation

/// A value in an AMQP field table (message headers, queue arguments, client properties).
public enum FieldValue: Sendable {
    case string(String)
    case int(Int64)
    case bool(Bool)
    case table([(String, FieldValue)])

    /// As an operator would write it in a policy or `rabbitmqadmin` call.
    public var text: String {
        switch self {
        case .string(let value): value
        case .int(let value): String(value)
        case .bool(let value): String(value)
        case .table(let entries): "{" + entries.map { "\($0.0)=\($0.1.text)" }.joined(separator: ", ") + "}"
        }
    }
}

/// C memory for the duration of one rabbitmq-c call: strings, table entries. rabbitmq-c copies what it
/// sends, so everything is freed when the arena goes away.
final class CArena {
    private var blocks: [UnsafeMutableRawPointer] = []

    deinit { blocks.forEach { free($0) } }

    func bytes(_ text: String) -> amqp_bytes_t {
        bytes(Data(text.utf8))
    }

    func bytes(_ data: Data) -> amqp_bytes_t {
        guard !data.isEmpty, let block = malloc(data.count) else { return amqp_bytes_t(len: 0, bytes: nil) }
        blocks.append(block)
        data.withUnsafeBytes { block.copyMemory(from: $0.baseAddress!, byteCount: data.count) }
        return amqp_bytes_t(len: data.count, bytes: block)
    }

    func cString(_ text: String) -> UnsafePointer<CChar> {
        let copy = strdup(text)!
        blocks.append(UnsafeMutableRawPointer(copy))
        return UnsafePointer(copy)
    }

    func table(_ entries: [(String, FieldValue)]) -> amqp_table_t {
        guard !entries.isEmpty else { return amqp_empty_table }
        let raw = malloc(MemoryLayout<amqp_table_entry_t>.stride * entries.count)!
        blocks.append(raw)
        let array = raw.bindMemory(to: amqp_table_entry_t.self, capacity: entries.count)
        for (i, (key, value)) in entries.enumerated() {
            array[i] = amqp_table_entry_t(key: bytes(key), value: field(value))
        }
        return amqp_table_t(num_entries: Int32(entries.count), entries: array)
    }

    func table(_ headers: [String: String]) -> amqp_table_t {
        // Sorted so the same headers always encode to the same bytes.
        table(headers.sorted { $0.key < $1.key }.map { ($0.key, FieldValue.string($0.value)) })
    }

    private func field(_ value: FieldValue) -> amqp_field_value_t {
        var field = amqp_field_value_t()
        switch value {
        case .string(let text):
            field.kind = UInt8(ascii: "S")
            field.value.bytes = bytes(text)
        case .int(let number):
            field.kind = UInt8(ascii: "l")
            field.value.i64 = number
        case .bool(let flag):
            field.kind = UInt8(ascii: "t")
            field.value.boolean = flag ? 1 : 0
        case .table(let entries):
            field.kind = UInt8(ascii: "F")
            field.value.table = table(entries)
        }
        return field
    }
}

extension amqp_bytes_t {
    /// Copies the bytes out; rabbitmq-c reuses its buffers after the next call.
    var data: Data {
        guard len > 0, let bytes else { return Data() }
        return Data(bytes: bytes, count: len)
    }

    var string: String {
        guard len > 0, let bytes else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: bytes, count: len), as: UTF8.self)
    }
}

extension amqp_table_t {
    /// Entries whose values have a natural text form; nested tables, arrays, void and decimals are left out.
    var stringValues: [String: String] {
        var result: [String: String] = [:]
        guard num_entries > 0, let entries else { return result }
        for i in 0..<Int(num_entries) {
            let entry = entries[i]
            let value = entry.value
            let text: String?
            switch value.kind {
            case UInt8(ascii: "S"), UInt8(ascii: "x"): text = value.value.bytes.string
            case UInt8(ascii: "t"): text = value.value.boolean != 0 ? "true" : "false"
            case UInt8(ascii: "b"): text = String(value.value.i8)
            case UInt8(ascii: "B"): text = String(value.value.u8)
            case UInt8(ascii: "s"): text = String(value.value.i16)
            case UInt8(ascii: "u"): text = String(value.value.u16)
            case UInt8(ascii: "I"): text = String(value.value.i32)
            case UInt8(ascii: "i"): text = String(value.value.u32)
            case UInt8(ascii: "l"): text = String(value.value.i64)
            case UInt8(ascii: "L"), UInt8(ascii: "T"): text = String(value.value.u64)
            case UInt8(ascii: "f"): text = String(value.value.f32)
            case UInt8(ascii: "d"): text = String(value.value.f64)
            default: text = nil
            }
            if let text { result[entry.key.string] = text }
        }
        return result
    }
}

extension amqp_field_value_t {
    /// Integers of any width as Int; nil for anything else.
    var integer: Int? {
        switch kind {
        case UInt8(ascii: "b"): return Int(value.i8)
        case UInt8(ascii: "B"): return Int(value.u8)
        case UInt8(ascii: "s"): return Int(value.i16)
        case UInt8(ascii: "u"): return Int(value.u16)
        case UInt8(ascii: "I"): return Int(value.i32)
        case UInt8(ascii: "i"): return Int(value.u32)
        case UInt8(ascii: "l"): return Int(value.i64)
        case UInt8(ascii: "L"), UInt8(ascii: "T"): return Int(exactly: value.u64)
        default: return nil
        }
    }
}

extension amqp_table_t {
    func entry(_ key: String) -> amqp_field_value_t? {
        guard num_entries > 0, let entries else { return nil }
        for i in 0..<Int(num_entries) where entries[i].key.string == key { return entries[i].value }
        return nil
    }

    /// The newest `x-death` entry (RabbitMQ puts it first), if the broker dead-lettered the message.
    var newestDeath: BrokerDeath? {
        guard let deaths = entry("x-death"), deaths.kind == UInt8(ascii: "A"),
              deaths.value.array.num_entries > 0, let first = deaths.value.array.entries?.pointee,
              first.kind == UInt8(ascii: "F") else { return nil }
        let table = first.value.table
        func text(_ key: String) -> String {
            guard let value = table.entry(key), value.kind == UInt8(ascii: "S") else { return "" }
            return value.value.bytes.string
        }
        var firstRoutingKey = ""
        if let keys = table.entry("routing-keys"), keys.kind == UInt8(ascii: "A"), keys.value.array.num_entries > 0,
           let key = keys.value.array.entries?.pointee, key.kind == UInt8(ascii: "S") {
            firstRoutingKey = key.value.bytes.string
        }
        return BrokerDeath(reason: text("reason"), queue: text("queue"),
                           count: table.entry("count")?.integer ?? 1,
                           time: table.entry("time")?.integer.map { Date(timeIntervalSince1970: Double($0)) },
                           routingKey: firstRoutingKey)
    }
}
