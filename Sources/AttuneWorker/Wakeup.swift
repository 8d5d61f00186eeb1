import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Lets other threads wake the broker thread out of poll(2), where it waits on its socket: a
/// non-blocking pipe that is readable once `signal()` was called and until `reset()`.
final class Wakeup: Sendable {
    private let readEnd: Int32
    private let writeEnd: Int32

    init() {
        var ends: [Int32] = [0, 0]
        precondition(pipe(&ends) == 0, "pipe failed: errno \(errno)")
        for end in ends { _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK) }
        readEnd = ends[0]
        writeEnd = ends[1]
    }

    deinit {
        close(readEnd)
        close(writeEnd)
    }

    func signal() {
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }

    func reset() {
        var bytes = [UInt8](repeating: 0, count: 64)
        while read(readEnd, &bytes, bytes.count) > 0 {}
    }

    /// Waits until `socket` is readable, `signal()` was called, or `timeout` passes.
    func wait(socket: Int32, timeout: TimeInterval) {
        var fds = [pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: socket, events: Int16(POLLIN), revents: 0)]
        _ = poll(&fds, socket >= 0 ? 2 : 1, Int32(max(0, timeout) * 1000))
    }
}
