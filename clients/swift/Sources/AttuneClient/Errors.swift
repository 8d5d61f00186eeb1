import Foundation

/// Why an upload was refused. Each case's description says what to do about it. Error bodies of `attune serve`
/// are one line of text, kept in `reason`.
public enum AttuneUploadError: Error, Equatable, Sendable, CustomStringConvertible, LocalizedError {
    /// 412: the user's line has moved since the version the device trained from (another device, or a training
    /// job, wrote a version). `currentETag` is the head now. Fetch it and train again, or upload with
    /// `applyChange` (`ConflictPolicy`); `sync` does either.
    case preconditionFailed(currentETag: String?)
    /// 428: the upload carried no `If-Match`. A bug of the caller: upload through this client, which always sends one.
    case preconditionRequired
    /// 403: the token is another user's, may not fetch this model, or the operator has not enabled uploads for
    /// the model (`attune model uploads --name MODEL --max-change-norm N`).
    case forbidden(reason: String)
    /// 413: the body is larger than the server's `--max-upload-bytes`. Upload the parameters
    /// (`UpdateParameters`) rather than a whole `.mlmodel`, or ask the operator to raise the limit.
    case tooLarge
    /// 422: the server read the upload and refused it: another base, unknown or missing tensor names, wrong
    /// shapes, values that are not finite, a change larger than the model allows, or an idempotency key already
    /// used with another body. Retrying the same upload gives the same answer: fix what `reason` names.
    case unprocessable(reason: String)
    /// 409: `applyChange` was asked for a change trained too many versions behind the head (or on another base).
    /// Fetch the head and train again.
    case tooStale(reason: String)
    /// 503: the server is busy. Keep the trained parameters and the idempotency key, and upload again after
    /// `retryAfter` seconds.
    case busy(retryAfter: TimeInterval?)
    /// 401: no token, or one expired, tampered, of a retired key or too long-lived. The token closure must return
    /// a fresh token signed by the app's backend.
    case unauthorized
    /// 400, or refused before sending: a missing or malformed header (the idempotency key must match
    /// `[A-Za-z0-9_-]{1,100}`, the device name `[A-Za-z0-9_-]{1,64}`).
    case badRequest(reason: String)
    /// Any other answer ( 415 a content type the server does not take, 5xx): the status and the body.
    case unexpected(status: Int, body: String)

    public var description: String {
        switch self {
        case .preconditionFailed(let etag):
            return "412 precondition failed: the model moved on (now \(etag ?? "unknown")) since the version this "
                + "device trained from; fetch it and train again, or upload with ConflictPolicy.applyChange"
        case .preconditionRequired:
            return "428 precondition required: the upload had no If-Match naming the version it was trained from"
        case .forbidden(let reason):
            return "403 forbidden (\(reason)): the token may not upload to this user's model, or the operator has not "
                + "enabled uploads for it (attune model uploads --name MODEL --max-change-norm N)"
        case .tooLarge:
            return "413 too large: upload UpdateParameters rather than a whole .mlmodel, or raise serve's --max-upload-bytes"
        case .unprocessable(let reason):
            return "422 unprocessable: \(reason); the same upload will be refused again, fix the parameters"
        case .tooStale(let reason):
            return "409 too stale to apply (\(reason)): fetch the newest model and train again"
        case .busy(let retryAfter):
            return "503 busy: upload again with the same idempotency key after \(retryAfter.map { "\($0)" } ?? "a few") seconds"
        case .unauthorized:
            return "401 unauthorized: the token is missing, expired or not valid; get a fresh one from the app's backend"
        case .badRequest(let reason):
            return "400 bad request: \(reason)"
        case .unexpected(let status, let body):
            return "unexpected answer \(status): \(body)"
        }
    }

    public var errorDescription: String? { description }
}

/// Why a fetch failed. Each case's description says what to do about it.
public enum AttuneFetchError: Error, Equatable, Sendable, CustomStringConvertible, LocalizedError {
    /// 401: the token is missing, expired or not valid; the token closure must return a fresh one.
    case unauthorized
    /// 403: the token is another user's, or may not fetch this model.
    case forbidden(reason: String)
    /// 404: no model of that name (or no base deployed for it).
    case notFound(reason: String)
    /// 503: the server is busy; keep the model you have and fetch again after `retryAfter` seconds.
    case busy(retryAfter: TimeInterval?)
    /// The server sent an ETag that is not one of attune's (`"MODEL@BASE/USER/vN"`).
    case malformedETag(String)
    /// Any other answer: the status and the body.
    case unexpected(status: Int, body: String)

    public var description: String {
        switch self {
        case .unauthorized:
            return "401 unauthorized: the token is missing, expired or not valid; get a fresh one from the app's backend"
        case .forbidden(let reason):
            return "403 forbidden (\(reason)): the token is another user's or may not fetch this model"
        case .notFound(let reason):
            return "404 not found (\(reason)): check the model's name and that a base is imported for it"
        case .busy(let retryAfter):
            return "503 busy: keep the model you hold and fetch again after \(retryAfter.map { "\($0)" } ?? "a few") seconds"
        case .malformedETag(let etag):
            return "the server's ETag \(etag) is not MODEL@BASE/USER/vN: is this attune serve's device port?"
        case .unexpected(let status, let body):
            return "unexpected answer \(status): \(body)"
        }
    }

    public var errorDescription: String? { description }
}
