@testable import AttuneHTTP
import Foundation
import XCTest

final class OperatorCredentialsTests: XCTestCase {
    /// Written by Apache's `htpasswd -nbB -C 5 ops 'correct horse battery staple'` (apache2-utils 2.4), the
    /// tool operators already use: its `$2y$` hashes must verify.
    static let htpasswdLine = "ops:$2y$05$5HXkW79Bl/n1i9y6ivUifugeWGMNZHKXtpXUbJMi5eyW8fWA9meVa"

    func file(_ text: String) throws -> String {
        let path = NSTemporaryDirectory() + "/operators-\(UUID().uuidString)"
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
        return path
    }

    func testApachesHtpasswdHashesAndOurOwnVerify() throws {
        let ours = OperatorCredentials.line(name: "dana", password: "another long password", cost: 5)
        let operators = try OperatorCredentials.load(path: try file("# operators\n\(Self.htpasswdLine)\n\(ours)\n"))
        XCTAssertEqual(operators.names, ["dana", "ops"])
        XCTAssertTrue(operators.verify(name: "ops", password: "correct horse battery staple"))
        XCTAssertTrue(operators.verify(name: "ops", password: "correct horse battery staple"), "again, from memory")
        XCTAssertFalse(operators.verify(name: "ops", password: "correct horse battery stapl"))
        XCTAssertFalse(operators.verify(name: "ops", password: ""))
        XCTAssertTrue(operators.verify(name: "dana", password: "another long password"))
        XCTAssertFalse(operators.verify(name: "dana", password: "correct horse battery staple"), "another operator's password")
        XCTAssertFalse(operators.verify(name: "nobody", password: "correct horse battery staple"))
        XCTAssertTrue(ours.hasPrefix("dana:$2b$05$"))
    }

    /// The reason `attune serve` logs when it starts no admin listener: which file, why, and the command that
    /// mends it, never a line of the file (they are password hashes).
    func testEveryFileThatGivesNoOperatorSaysWhichFileWhyAndWhatToDo() throws {
        func reason(_ path: String) -> OperatorsFileError? {
            do {
                _ = try OperatorCredentials.load(path: path)
                return nil
            } catch {
                return error
            }
        }
        let missing = NSTemporaryDirectory() + "/operators-\(UUID().uuidString)"
        XCTAssertEqual(reason(missing), .missing(path: missing))
        XCTAssertEqual(reason(NSTemporaryDirectory()), .unreadable(path: NSTemporaryDirectory(), reason: "it is a directory"))
        for text in ["", "\n\n", "# nobody\n"] {
            let path = try file(text)
            XCTAssertEqual(reason(path), .empty(path: path), text)
        }
        let secret = "ops:plaintext-password"
        for (text, line) in [(secret + "\n", 1), ("ops\n", 1), ("ops:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", 1),
                             ("# operators\n\n\(Self.htpasswdLine)\n\(secret)\n", 4)] {
            let path = try file(text)
            XCTAssertEqual(reason(path), .malformed(path: path, line: line), text)
        }
        let malformed = try file("\(Self.htpasswdLine)\n\(secret)\n")
        for error in [reason(missing), reason(try file("")), reason(malformed)].compactMap({ $0 }) {
            XCTAssertTrue(error.description.contains(error.path), "\(error)")
            XCTAssertTrue(error.description.contains("attune operator add --file \(error.path) NAME"), "\(error)")
            XCTAssertFalse(error.description.contains("plaintext-password") || error.description.contains("$2"), "\(error)")
        }
        XCTAssertTrue(reason(missing)?.description.contains("is missing") ?? false)
        XCTAssertTrue(reason(try file(""))?.description.contains("is empty") ?? false)
        XCTAssertTrue(reason(NSTemporaryDirectory())?.description.contains("is unreadable") ?? false)
        XCTAssertTrue(reason(malformed)?.description.contains("is malformed: line 2") ?? false)
    }

    /// A file saved with Windows line ends: each line is one operator, and the carriage return is no part of
    /// the hash.
    func testAFileWithWindowsLineEndsReadsLineByLine() throws {
        let dana = OperatorCredentials.line(name: "dana", password: "another long password", cost: 5)
        let operators = try OperatorCredentials.load(path: try file("\(Self.htpasswdLine)\r\n\(dana)\r\n"))
        XCTAssertEqual(operators.names, ["dana", "ops"])
        XCTAssertTrue(operators.verify(name: "ops", password: "correct horse battery staple"))
        XCTAssertTrue(operators.verify(name: "dana", password: "another long password"))
        let path = try file("\(Self.htpasswdLine)\r\nbroken\r\n")
        XCTAssertThrowsError(try OperatorCredentials.load(path: path)) {
            XCTAssertEqual($0 as? OperatorsFileError, .malformed(path: path, line: 2))
        }
    }
}
