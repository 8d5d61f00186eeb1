import AttuneSpec
import AttuneStore
import Foundation
import Hummingbird
import NIOFoundationEssentialsCompat

/// `GET /api/jobs/ID` and `POST /api/jobs/lookup` on the admin listener: what became of jobs, for the
/// producers that published them (with a producer's credential) and for operators. A job no worker has
/// settled answers `"state": "unknown"`, not 404: the producer asks again later.
enum JobOutcomesAPI {
    static let lookupPath = "/api/jobs/lookup"
    /// A thousand ids of 128 characters, quoted, with room for spaces.
    static let lookupBodyLimit = ModelRegistry.outcomeLookupLimit * 140 + 1024

    static func add(to router: Router<some RequestContext>, delivery: ModelDelivery) {
        router.get("api/jobs/:jobId") { _, context -> Response in
            let jobId = context.parameters.get("jobId") ?? ""
            guard Identifier.isValid(jobId) else { return refusal("the job id must match [A-Za-z0-9_-]{1,128}") }
            let body: Data = try await delivery.withRegistry { registry in
                try JobOutcomeRecord.json(try registry.jobOutcomes([jobId]), single: true)
            }
            return Dashboard.json(body)
        }
        router.post("api/jobs/lookup") { request, _ -> Response in
            let limit = ModelRegistry.outcomeLookupLimit
            let buffer = try await request.body.collect(upTo: lookupBodyLimit)
            guard let object = try? JSONSerialization.jsonObject(with: Data(buffer: buffer)) as? [String: Any],
                  let ids = object["jobIds"] as? [String] else {
                return refusal("send {\"jobIds\": [\"...\", ...]}, at most \(limit) ids")
            }
            guard ids.count <= limit else { return refusal("\(ids.count) ids: at most \(limit) a request") }
            if let bad = ids.first(where: { !Identifier.isValid($0) }) {
                return refusal("job id \(String(reflecting: String(bad.prefix(140)))) does not match [A-Za-z0-9_-]{1,128}")
            }
            let body: Data = try await delivery.withRegistry { registry in
                try JobOutcomeRecord.json(try registry.jobOutcomes(ids), single: false)
            }
            return Dashboard.json(body)
        }
    }

    private static func refusal(_ message: String) -> Response {
        Response(status: .badRequest, headers: [.contentType: "text/plain; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: message + "\n")))
    }
}
