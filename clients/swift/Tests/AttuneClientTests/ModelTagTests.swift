import XCTest
@testable import AttuneClient

final class ModelTagTests: XCTestCase {
    func testPersonalETag() throws {
        let tag = try XCTUnwrap(ModelTag(etag: "\"digits@1/alice/v7\""))
        XCTAssertEqual(tag, ModelTag(model: "digits", base: 1, user: "alice", version: 7))
        XCTAssertEqual(tag.etag, "\"digits@1/alice/v7\"")
    }

    func testVersionZeroIsTheBase() throws {
        let tag = try XCTUnwrap(ModelTag(etag: "\"swiftclient_digits@12/bob-2/v0\""))
        XCTAssertEqual(tag.model, "swiftclient_digits")
        XCTAssertEqual(tag.base, 12)
        XCTAssertEqual(tag.user, "bob-2")
        XCTAssertEqual(tag.version, 0)
    }

    func testBaseETag() throws {
        let tag = try XCTUnwrap(ModelTag(etag: "\"digits@3\""))
        XCTAssertEqual(tag, ModelTag(model: "digits", base: 3, user: nil, version: 0))
        XCTAssertEqual(tag.etag, "\"digits@3\"")
    }

    func testUserWithSlashOrAt() throws {
        XCTAssertEqual(ModelTag(etag: "\"m@2/team/ann/v10\"")?.user, "team/ann")
        XCTAssertEqual(ModelTag(etag: "\"m@2/ann@example.com/v1\"")?.user, "ann@example.com")
    }

    func testNotAttunesETags() {
        for etag in ["digits@1/alice/v7", "W/\"digits@1/alice/v7\"", "\"digits/alice/v7\"", "\"digits@x/alice/v7\"",
                     "\"digits@1/alice/7\"", "\"digits@1/alice/v\"", "\"digits@1//v7\"", "\"@1/alice/v7\"",
                     "\"digits@1/alice/v-1\"", "\"\"", "\""] {
            XCTAssertNil(ModelTag(etag: etag), etag)
        }
    }

    func testPersonalModelKeepsTheETagAsSent() throws {
        let m = try PersonalModel(data: Data([1, 2]), etag: "\"digits@1/alice/v7\"")
        XCTAssertEqual(m.version, 7)
        XCTAssertEqual(m.etag, "\"digits@1/alice/v7\"")
        XCTAssertThrowsError(try PersonalModel(data: Data(), etag: "nope")) { error in
            XCTAssertEqual(error as? AttuneFetchError, .malformedETag("nope"))
        }
    }
}
