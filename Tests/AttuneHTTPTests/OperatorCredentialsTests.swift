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

    func testAFileThatIsNotAnHtpasswdFileIsRefusedSayingWhatToDo() throws {
        for text in ["", "# nobody\n", "ops:plaintext\n", "ops\n", "ops:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n"] {
            XCTAssertThrowsError(try OperatorCredentials.load(path: try file(text)), text) { error in
                XCTAssertTrue("\(error)".contains("attune operator add") || "\(error)".contains("htpasswd -B"), "\(error)")
            }
        }
        XCTAssertThrowsError(try OperatorCredentials.load(path: "/nonexistent/operators"))
    }
}
