import AttuneCodecs
import AttuneSpec
import AttuneTraining
import Foundation

// libFuzzer calls `LLVMFuzzerTestOneInput` with each input it makes up. The input goes through what a
// worker does with a delivery before it trains: decode as protobuf and as JSON, then for each job that
// decodes, the identifier checks, the content digest, the parameter overrides and the sample checks
// against a real updatable model. Any thrown error is a correct refusal; a trap, an overflow or a hang
// is a finding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJobDecoder(_ bytes: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    let body = Data(bytes: bytes, count: count)
    for encoding in MessageEncoding.allCases {
        guard let job = try? JobCodec.decode(body, contentType: encoding.contentType) else { continue }
        validate(job)
    }
    return 0
}

func validate(_ job: Attune_V1_TrainingJob) {
    // Each check runs even when an earlier one refuses, so every one of them sees every input.
    _ = Identifier.isValid(job.jobID)
    _ = Identifier.isValid(job.userID)
    _ = Identifier.isValid(job.model)
    _ = try? JobDigest.of(job)
    _ = try? fuzzModel.resolveParameters(job.parameters)
    _ = try? fuzzModel.prepareBatch(job.samples, maxSamples: maxSamples)
    // What goes out again must decode again: the dead-letter queue and replay re-send these bytes' jobs.
    for encoding in MessageEncoding.allCases {
        guard let (body, contentType) = try? JobCodec.encode(job, as: encoding) else { continue }
        if (try? JobCodec.decode(body, contentType: contentType, maxBytes: .max)) == nil {
            fatalError("a job that decoded does not decode after encoding it as \(encoding)")
        }
    }
}
