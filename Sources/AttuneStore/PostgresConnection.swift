internal import CLibPQ
public import Foundation

/// One libpq connection. Not thread-safe: libpq allows one thread at a time per connection, so each
/// thread (each worker slot) opens its own. Every statement goes through `PQexecParams` with the
/// values as separate parameters (text, or binary for `BinaryBytea`).
public final class PostgresConnection {
    private var handle: OpaquePointer?
    private var savepointDepth = 0
    /// Requests sent to the server and answered (statements and client-side large-object calls), so
    /// tests and benchmarks can see what an operation costs in waits for the network.
    public private(set) var roundTrips = 0
    /// The URL with its password hidden, for logs and errors.
    public let redactedURL: String

    /// Connects with a libpq URI (`postgresql://user:pass@host:port/db`) or `key=value` string.
    public init(url: String) throws {
        redactedURL = Self.redacted(url)
        // A malformed URL is a configuration mistake, not an outage: report it as non-transient
        // before PQconnectdb folds it into a generic connection failure.
        var parseError: UnsafeMutablePointer<CChar>?
        if let options = PQconninfoParse(url, &parseError) {
            PQconninfoFree(options)
        } else {
            let message = parseError.map { String(cString: $0) } ?? "out of memory"
            PQfreemem(parseError)
            throw DatabaseError(kind: .misuse, operation: "connect to \(redactedURL)",
                                message: Self.trimmed(message),
                                hint: "use postgresql://user:password@host:port/database")
        }
        guard let conn = PQconnectdb(url) else {
            throw DatabaseError(kind: .connection, operation: "connect to \(redactedURL)",
                                message: "libpq could not allocate a connection")
        }
        guard PQstatus(conn) == CONNECTION_OK else {
            let message = Self.trimmed(String(cString: PQerrorMessage(conn)))
            let server = Self.server(of: conn)
            PQfinish(conn)
            // A refusal that names a missing database or role or a wrong password repeats until someone fixes
            // the deployment: it is a mistake to report, not an outage to wait out.
            if let mistake = ConnectionMistake(serverMessage: message) {
                throw DatabaseError(kind: .configuration, operation: "connect to \(redactedURL)", sqlState: mistake.sqlState,
                                    message: message, server: server)
            }
            throw DatabaseError(kind: .connection, operation: "connect to \(redactedURL)", message: message, server: server)
        }
        // libpq prints NOTICEs ("... already exists, skipping") to stderr by default; they are
        // expected chatter from idempotent DDL, not something an operator should act on.
        PQsetNoticeProcessor(conn, { _, _ in }, nil)
        handle = conn
    }

    deinit { close() }

    /// `host:port` of the server libpq tried last (of a multi-host URL, the one that refused).
    private static func server(of conn: OpaquePointer) -> String? {
        guard let host = PQhost(conn).map({ String(cString: $0) }), !host.isEmpty else { return nil }
        let port = PQport(conn).map { String(cString: $0) } ?? ""
        return port.isEmpty ? host : "\(host):\(port)"
    }

    /// Frees the connection. Safe to call twice; later calls on this object throw.
    public func close() {
        if let handle { PQfinish(handle) }
        handle = nil
    }

    /// False after `close()` or once libpq has noticed the server is gone; open a new connection then.
    public var isConnected: Bool {
        guard let handle else { return false }
        return PQstatus(handle) == CONNECTION_OK
    }

    /// True between BEGIN and COMMIT/ROLLBACK (including a transaction aborted by an error).
    public var isInTransaction: Bool {
        guard let handle else { return false }
        let status = PQtransactionStatus(handle)
        return status == PQTRANS_INTRANS || status == PQTRANS_INERROR
    }

    // MARK: - Statements

    /// Runs one statement. `$1`, `$2`, ... in `sql` refer to `params`; nil binds SQL NULL.
    @discardableResult
    public func query(_ sql: String, _ params: [(any PostgresBindable)?] = []) throws -> QueryResult {
        let conn = try open(Self.describe(sql))
        roundTrips += 1
        let result = Self.withParameters(params) { types, values, lengths, formats in
            PQexecParams(conn, sql, Int32(values.count), types, values, lengths, formats, 0)
        }
        defer { PQclear(result) }
        try check(result, operation: Self.describe(sql))
        return Self.copy(result!)
    }

    /// Runs a script of several statements without parameters. Internal on purpose: only trusted
    /// files (migrations) may use it, so `query` stays the only way in for anything built at runtime.
    func executeScript(_ sql: String, operation: String) throws {
        let conn = try open(operation)
        roundTrips += 1
        let result = PQexec(conn, sql)
        defer { PQclear(result) }
        try check(result, operation: operation)
    }

    // MARK: - Notifications

    /// Waits up to `timeout` seconds for NOTIFY messages on channels this connection LISTENs to, and
    /// returns their payloads (empty on a timeout). Throws a connection error once the server is gone, so a
    /// listener knows it may have missed some.
    public func notifications(timeout: TimeInterval) throws -> [String] {
        let conn = try open("wait for notifications")
        var payloads = drainNotifications(conn)
        guard payloads.isEmpty else { return payloads }
        var poller = pollfd(fd: PQsocket(conn), events: Int16(POLLIN), revents: 0)
        guard poller.fd >= 0 else { throw lastError("wait for notifications") }
        let ready = poll(&poller, 1, Int32(max(0, timeout) * 1000))
        if ready < 0 && errno != EINTR { throw lastError("wait for notifications") }
        if ready > 0 {
            guard PQconsumeInput(conn) == 1, PQstatus(conn) == CONNECTION_OK else {
                throw lastError("wait for notifications")
            }
            payloads = drainNotifications(conn)
        }
        return payloads
    }

    private func drainNotifications(_ conn: OpaquePointer) -> [String] {
        var payloads: [String] = []
        while let notice = PQnotifies(conn) {
            payloads.append(String(cString: notice.pointee.extra))
            PQfreemem(notice)
        }
        return payloads
    }

    /// Runs `body` in a transaction: COMMIT when it returns, ROLLBACK when it throws. Nested calls
    /// become savepoints, so an inner failure undoes only the inner work.
    /// `snapshot`: one snapshot for every statement (REPEATABLE READ), for reads that must agree with each
    /// other; ignored when nested (the outer transaction decides).
    @discardableResult
    public func transaction<T>(snapshot: Bool = false, _ body: () throws -> T) throws -> T {
        if isInTransaction {
            return try savepoint(body)
        }
        try query(snapshot ? "BEGIN ISOLATION LEVEL REPEATABLE READ" : "BEGIN")
        let value: T
        do {
            value = try body()
        } catch {
            rollbackQuietly()
            throw error
        }
        if let handle, PQtransactionStatus(handle) == PQTRANS_INERROR {
            // COMMIT of an aborted transaction silently rolls back; say so instead of pretending.
            rollbackQuietly()
            throw DatabaseError(kind: .misuse, operation: "COMMIT",
                                message: "the transaction was aborted by an earlier error that the caller ignored; nothing was saved")
        }
        try query("COMMIT")
        return value
    }

    private func savepoint<T>(_ body: () throws -> T) throws -> T {
        savepointDepth += 1
        defer { savepointDepth -= 1 }
        let name = "attune_sp_\(savepointDepth)"
        try query("SAVEPOINT \(name)")
        do {
            let value = try body()
            try query("RELEASE SAVEPOINT \(name)")
            return value
        } catch {
            _ = try? query("ROLLBACK TO SAVEPOINT \(name)")
            throw error
        }
    }

    private func rollbackQuietly() {
        // If the connection broke, the server has already rolled back; the original error matters more.
        guard isConnected else { return }
        _ = try? query("ROLLBACK")
    }

    // MARK: - Large objects (client-side lo_* API)

    private static let chunkSize = 256 * 1024

    /// Stores `data` as a new large object and returns its oid. Must run inside `transaction`:
    /// large-object descriptors live only as long as the transaction that opened them.
    public func createLargeObject(_ data: Data) throws -> UInt32 {
        let conn = try requireTransaction("lo_creat")
        let oid = counted { lo_creat(conn, INV_READ | INV_WRITE) }
        guard oid != 0 else { throw lastError("lo_creat") }
        let fd = counted { lo_open(conn, oid, INV_WRITE) }
        guard fd >= 0 else { throw lastError("lo_open \(oid) for writing") }
        var failure: DatabaseError?
        data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            guard let base = raw.baseAddress?.assumingMemoryBound(to: CChar.self) else { return }
            var offset = 0
            while offset < raw.count {
                let length = min(Self.chunkSize, raw.count - offset)
                let written = counted { lo_write(conn, fd, base + offset, length) }
                guard written > 0 else {
                    failure = lastError("lo_write \(oid) at offset \(offset)")
                    return
                }
                offset += Int(written)
            }
        }
        if let failure { throw failure }
        guard counted({ lo_close(conn, fd) }) == 0 else { throw lastError("lo_close \(oid)") }
        return oid
    }

    /// Reads a whole large object. Must run inside `transaction`.
    public func readLargeObject(_ oid: UInt32) throws -> Data {
        let conn = try requireTransaction("lo_open")
        let fd = counted { lo_open(conn, oid, INV_READ) }
        guard fd >= 0 else { throw lastError("lo_open \(oid) for reading") }
        let end = counted { lo_lseek64(conn, fd, 0, SEEK_END) }
        guard end >= 0, counted({ lo_lseek64(conn, fd, 0, SEEK_SET) }) == 0 else { throw lastError("lo_lseek64 \(oid)") }
        var data = Data(count: Int(end))
        var failure: DatabaseError?
        data.withUnsafeMutableBytes { (raw: UnsafeMutableRawBufferPointer) in
            guard let base = raw.baseAddress?.assumingMemoryBound(to: CChar.self) else { return }
            var offset = 0
            while offset < raw.count {
                let read = counted { lo_read(conn, fd, base + offset, min(Self.chunkSize, raw.count - offset)) }
                guard read > 0 else {
                    failure = read < 0
                        ? lastError("lo_read \(oid) at offset \(offset)")
                        : DatabaseError(kind: .server, operation: "lo_read \(oid)",
                                        message: "large object ended at \(offset) bytes, expected \(raw.count); it changed while being read")
                    return
                }
                offset += Int(read)
            }
        }
        if let failure { throw failure }
        guard counted({ lo_close(conn, fd) }) == 0 else { throw lastError("lo_close \(oid)") }
        return data
    }

    /// Size in bytes of a large object. Must run inside `transaction`.
    public func largeObjectSize(_ oid: UInt32) throws -> Int64 {
        let conn = try requireTransaction("lo_open")
        let fd = counted { lo_open(conn, oid, INV_READ) }
        guard fd >= 0 else { throw lastError("lo_open \(oid) for reading") }
        let end = counted { lo_lseek64(conn, fd, 0, SEEK_END) }
        guard end >= 0 else { throw lastError("lo_lseek64 \(oid)") }
        guard counted({ lo_close(conn, fd) }) == 0 else { throw lastError("lo_close \(oid)") }
        return Int64(end)
    }

    /// Deletes a large object. Rows whose `lo` columns have `lo_manage` triggers do this themselves.
    public func unlinkLargeObject(_ oid: UInt32) throws {
        let conn = try requireTransaction("lo_unlink")
        guard counted({ lo_unlink(conn, oid) }) >= 0 else { throw lastError("lo_unlink \(oid)") }
    }

    /// One client-side large-object call: each is a request and an answer on the wire.
    private func counted<T>(_ call: () -> T) -> T {
        roundTrips += 1
        return call()
    }

    // MARK: - Logging

    /// `url` with any password replaced by `***`, in both URI and `key=value` forms.
    public static func redacted(_ url: String) -> String {
        var text = url
        // URI user info: scheme://user:password@host — the password runs to the last '@' before the path.
        text = replace(#"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@?]*):[^/?]*@"#, in: text, with: "$1:***@")
        // password=... as a URI query parameter or a keyword/value pair (possibly quoted).
        text = replace(#"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)"#, in: text, with: "$1***")
        return text
    }

    private static func replace(_ pattern: String, in text: String, with template: String) -> String {
        guard let regex = try? NSRegularExpression(pattern: pattern) else { return text }
        let range = NSRange(text.startIndex..., in: text)
        return regex.stringByReplacingMatches(in: text, range: range, withTemplate: template)
    }

    // MARK: - libpq plumbing

    // `operation` only names a failure, so it is built only for one: a query's description bridges its whole text
    // through NSString, which cost more than some of the statements it described.
    private func open(_ operation: @autoclosure () -> String) throws -> OpaquePointer {
        guard let handle else {
            throw DatabaseError(kind: .misuse, operation: operation(),
                                message: "the connection was closed; open a new PostgresConnection")
        }
        return handle
    }

    private func requireTransaction(_ operation: String) throws -> OpaquePointer {
        let conn = try open(operation)
        guard isInTransaction else {
            throw DatabaseError(kind: .misuse, operation: operation,
                                message: "large objects can only be used inside transaction { ... }")
        }
        return conn
    }

    private func lastError(_ operation: String) -> DatabaseError {
        guard let handle else {
            return DatabaseError(kind: .misuse, operation: operation, message: "the connection was closed")
        }
        let message = Self.trimmed(String(cString: PQerrorMessage(handle)))
        let kind: DatabaseError.Kind = PQstatus(handle) == CONNECTION_OK ? .server : .connection
        return DatabaseError(kind: kind, operation: operation, message: message.isEmpty ? "unknown error" : message)
    }

    private func check(_ result: OpaquePointer?, operation: @autoclosure () -> String) throws {
        guard let result else { throw lastError(operation()) }
        let status = PQresultStatus(result)
        if status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_EMPTY_QUERY { return }
        func field(_ code: UInt8) -> String? {
            PQresultErrorField(result, Int32(code)).map { String(cString: $0) }
        }
        let broken = handle.map { PQstatus($0) != CONNECTION_OK } ?? true
        let message = field(UInt8(ascii: "M")) ?? Self.trimmed(String(cString: PQresultErrorMessage(result)))
        throw DatabaseError(kind: broken ? .connection : .server, operation: operation(),
                            sqlState: field(UInt8(ascii: "C")),
                            message: message.isEmpty ? "unknown error" : message,
                            detail: field(UInt8(ascii: "D")), hint: field(UInt8(ascii: "H")),
                            constraint: field(UInt8(ascii: "n")))
    }

    private static func copy(_ result: OpaquePointer) -> QueryResult {
        let rows = Int(PQntuples(result))
        let columns = Int(PQnfields(result))
        let names = (0..<columns).map { String(cString: PQfname(result, Int32($0))) }
        var values = [[String?]]()
        values.reserveCapacity(rows)
        for r in 0..<rows {
            values.append((0..<columns).map { c in
                PQgetisnull(result, Int32(r), Int32(c)) == 1
                    ? nil : String(cString: PQgetvalue(result, Int32(r), Int32(c)))
            })
        }
        let affected = Int(String(cString: PQcmdTuples(result))) ?? 0
        return QueryResult(columnNames: names, values: values, affectedRows: affected)
    }

    /// The parameters as `PQexecParams` takes them: types (0: let the server infer), values, lengths
    /// (read for binary values only) and formats (0 text, 1 binary), in buffers that live during `body`.
    private static func withParameters<R>(
        _ params: [(any PostgresBindable)?],
        _ body: ([UInt32], [UnsafePointer<CChar>?], [Int32], [Int32]) -> R
    ) -> R {
        var types = [UInt32](), values = [UnsafeMutablePointer<CChar>?](), lengths = [Int32](), formats = [Int32]()
        for param in params {
            if let binary = param as? BinaryBytea {
                let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(binary.data.count, 1))
                binary.data.withUnsafeBytes { raw in
                    UnsafeMutableRawPointer(buffer).copyMemory(from: raw.baseAddress ?? UnsafeRawPointer(buffer), byteCount: raw.count)
                }
                types.append(BinaryBytea.typeOid)
                values.append(buffer)
                lengths.append(Int32(binary.data.count))
                formats.append(1)
            } else {
                types.append(0)
                values.append(param.map { strdup($0.postgresText)! })
                lengths.append(0)
                formats.append(0)
            }
        }
        defer { values.forEach { free($0) } }
        return body(types, values.map { $0.map { UnsafePointer($0) } }, lengths, formats)
    }

    /// A short label for errors: the statement's first line, cut at 80 characters.
    private static func describe(_ sql: String) -> String {
        let line = sql.trimmingCharacters(in: .whitespacesAndNewlines)
            .split(separator: "\n", maxSplits: 1).first.map(String.init) ?? ""
        let collapsed = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).joined(separator: " ")
        return "query \"" + (collapsed.count > 80 ? String(collapsed.prefix(77)) + "..." : collapsed) + "\""
    }

    private static func trimmed(_ message: String) -> String {
        message.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
