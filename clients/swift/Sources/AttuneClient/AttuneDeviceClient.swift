import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What `sync` does when the user's line moved while the device trained (a 412 on its upload).
public enum ConflictPolicy: Sendable, Equatable {
    /// Fetch the new head, call the training closure again on it, and upload that with the new head's ETag in
    /// `If-Match`. The default: the device's parameters were computed from other parameters than the head's, and
    /// only training on the head makes a version trained from its parent.
    case retrain
    /// Send the same parameters again with `If-Match: *` and `Attune-Trained-From: <the ETag trained from>`: the
    /// server adds the device's change (its parameters minus those it trained from) onto the head. Saves a training
    /// run; right when changes are small and touch different rows. A change too many versions behind the head
    /// (409) falls back to retraining.
    case applyChange
}

/// A version the server accepted.
public struct UploadResult: Sendable, Equatable {
    /// The new version's number.
    public let version: Int
    /// The new version's ETag, quoted.
    public let etag: String
    /// The version it was written on (the trained-from version, or the head for an applied change).
    public let parentVersion: Int
    /// The id the server gave it (`device-…`), as in `attune model history`.
    public let jobId: String
    /// True when this answer is the server's replay of an upload it had already accepted with the same key.
    public let replayed: Bool
    /// The idempotency key the upload carried.
    public let idempotencyKey: String
    /// Set when the model has a quality gate (`attune model gate`) that holds this version back: why. A held
    /// version is kept but not delivered; devices go on getting the previous one until an operator releases it.
    public let held: String?

    public var tag: ModelTag? { ModelTag(etag: etag) }
}

/// What a training run produced, with what the server records of it.
public struct TrainedUpdate: Sendable, Equatable {
    public var body: UploadBody
    /// How many samples the device trained on (`Attune-Samples`).
    public var samples: Int?
    /// The training loss at the end (`Attune-Loss`).
    public var loss: Double?
    /// Accuracy on held-out samples (`Attune-Validation-Accuracy`), which the model's quality gate judges.
    public var validationAccuracy: Double?
    /// How many held-out samples that accuracy is of (`Attune-Validation-Samples`).
    public var validationSamples: Int?

    public init(parameters: UpdateParameters, samples: Int? = nil, loss: Double? = nil,
                validationAccuracy: Double? = nil, validationSamples: Int? = nil) {
        self.init(body: .parameters(parameters), samples: samples, loss: loss,
                  validationAccuracy: validationAccuracy, validationSamples: validationSamples)
    }

    /// A whole `.mlmodel` file as the device wrote it (`MLUpdateContext.model.write(to:)`).
    public init(mlmodel: Data, samples: Int? = nil, loss: Double? = nil,
                validationAccuracy: Double? = nil, validationSamples: Int? = nil) {
        self.init(body: .mlmodel(mlmodel), samples: samples, loss: loss,
                  validationAccuracy: validationAccuracy, validationSamples: validationSamples)
    }

    public init(body: UploadBody, samples: Int?, loss: Double?, validationAccuracy: Double?, validationSamples: Int?) {
        self.body = body
        self.samples = samples
        self.loss = loss
        self.validationAccuracy = validationAccuracy
        self.validationSamples = validationSamples
    }
}

/// What a training closure of `sync` may return: `UpdateParameters`, or a `TrainedUpdate` that also says how
/// many samples it trained on and how well.
public protocol DeviceTrainingOutput: Sendable {
    var trainedUpdate: TrainedUpdate { get }
}

extension UpdateParameters: DeviceTrainingOutput {
    public var trainedUpdate: TrainedUpdate { TrainedUpdate(parameters: self) }
}

extension TrainedUpdate: DeviceTrainingOutput {
    public var trainedUpdate: TrainedUpdate { self }
}

/// What `sync` did.
public struct SyncResult: Sendable, Equatable {
    /// The accepted upload.
    public let upload: UploadResult
    /// The model the accepted parameters were trained from.
    public let trainedFrom: PersonalModel
    /// How many times the training closure ran (1 unless the line moved and the policy retrained).
    public let trainingRuns: Int
    /// True when the server applied the device's change onto a newer head (`ConflictPolicy.applyChange`).
    public let appliedChange: Bool
}

/// How often a request is sent again after a network error (no answer: the connection failed or was lost). An
/// upload is sent again with the same idempotency key, so a version the server made before the answer was lost is
/// answered again (201, `replayed`), never made twice.
public struct RetryPolicy: Sendable, Equatable {
    /// Sends in all, the first included.
    public var maxAttempts: Int
    /// The wait before the second send; doubled before each next one.
    public var initialDelay: TimeInterval

    public init(maxAttempts: Int = 3, initialDelay: TimeInterval = 0.5) {
        self.maxAttempts = max(1, maxAttempts)
        self.initialDelay = max(0, initialDelay)
    }
}

/// A device's client of `attune serve`'s device port, for one user's model: fetch it (`If-None-Match`, 304), upload
/// what the device trained (`If-Match`, idempotency key), or both with conflicts resolved (`sync`).
///
/// It holds the last model it fetched (bytes and ETag). Safe to share between tasks.
public final class AttuneDeviceClient: @unchecked Sendable {  // the mutable state is `held`, under `lock`
    public let baseURL: URL
    public let model: String
    public let user: String
    /// The device's attributes, sent as query parameters on fetches (a deployment's rules match them).
    public let attributes: [String: String]
    public let retry: RetryPolicy
    private let token: @Sendable () async throws -> String
    private let session: URLSession
    private let lock = NSLock()
    private var _held: PersonalModel?

    /// - Parameters:
    ///   - baseURL: the device port, `https://attune.example`.
    ///   - model: the model's name, `digits`.
    ///   - user: the user id the token is bound to.
    ///   - token: returns a device token (JWT) for `user` from the app's backend; called for every request, and
    ///     once more after a 401, so it may cache a token until it expires.
    ///   - holding: the model the device already has (so the first fetch can be a 304).
    ///   - attributes: query parameters for deployments, `["region": "eu"]`.
    ///   - session: a URLSession; by default an ephemeral one with no URL cache, so that 304s reach this client.
    public init(baseURL: URL, model: String, user: String, token: @escaping @Sendable () async throws -> String,
                holding: PersonalModel? = nil, attributes: [String: String] = [:], retry: RetryPolicy = RetryPolicy(),
                session: URLSession? = nil) {
        self.baseURL = baseURL
        self.model = model
        self.user = user
        self.token = token
        self._held = holding
        self.attributes = attributes
        self.retry = retry
        if let session {
            self.session = session
        } else {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.urlCache = nil
            configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
            self.session = URLSession(configuration: configuration)
        }
    }

    /// The model this client holds: the last one fetched, or the one it was given.
    public var held: PersonalModel? {
        lock.lock(); defer { lock.unlock() }
        return _held
    }

    private func hold(_ model: PersonalModel) {
        lock.lock(); defer { lock.unlock() }
        _held = model
    }

    /// A new idempotency key (a UUID): one per training run's result, kept with the result until it is uploaded.
    public static func newIdempotencyKey() -> String { UUID().uuidString }

    // MARK: Fetching

    /// Fetches the user's newest model, sending the ETag of the one held in `If-None-Match`.
    /// - Returns: `.updated` with a model the client did not hold (now held), or `.notModified` with the held one.
    /// - Throws: `AttuneFetchError`, or the `URLError` of a network failure after `retry`'s attempts.
    public func fetch() async throws -> FetchResult {
        var request = URLRequest(url: modelURL(query: attributes))
        request.httpMethod = "GET"
        let held = self.held
        if let held { request.setValue(held.etag, forHTTPHeaderField: "If-None-Match") }
        let (data, response) = try await send(request)
        switch response.statusCode {
        case 200:
            guard let etag = response.value(forHTTPHeaderField: "ETag") else {
                throw AttuneFetchError.malformedETag("(none)")
            }
            let model = try PersonalModel(data: data, etag: etag)
            hold(model)
            return .updated(model)
        case 304:
            guard let held else { throw AttuneFetchError.unexpected(status: 304, body: "304 to a request without If-None-Match") }
            return .notModified(held)
        case 401: throw AttuneFetchError.unauthorized
        case 403: throw AttuneFetchError.forbidden(reason: Self.text(data))
        case 404: throw AttuneFetchError.notFound(reason: Self.text(data))
        case 503: throw AttuneFetchError.busy(retryAfter: Self.retryAfter(response))
        default: throw AttuneFetchError.unexpected(status: response.statusCode, body: Self.text(data))
        }
    }

    // MARK: Uploading

    /// Uploads the parameters a device trained from the model whose ETag is `etag` (`If-Match`).
    ///
    /// - Parameters:
    ///   - idempotencyKey: `[A-Za-z0-9_-]{1,100}`, one per training result (`newIdempotencyKey()`). Keep it with the
    ///     parameters until an answer arrives: an upload sent again with the same key and body is answered with
    ///     the version the first one made. Network errors are retried here with the same key (`retry`).
    ///   - device: the device's name, recorded with the version (`[A-Za-z0-9_-]{1,64}`).
    ///   - samples: how many samples it trained on.
    ///   - applyChange: send `If-Match: *` and `Attune-Trained-From: etag`, so that the server applies the change
    ///     onto its head whatever it is (see `ConflictPolicy.applyChange`).
    /// - Throws: `AttuneUploadError` (412 `.preconditionFailed` when the line moved), or a `URLError`.
    public func upload(parameters: UpdateParameters, trainedFrom etag: String, idempotencyKey: String,
                       device: String? = nil, samples: Int? = nil, loss: Double? = nil,
                       validationAccuracy: Double? = nil, validationSamples: Int? = nil,
                       applyChange: Bool = false) async throws -> UploadResult {
        try await upload(TrainedUpdate(parameters: parameters, samples: samples, loss: loss,
                                       validationAccuracy: validationAccuracy, validationSamples: validationSamples),
                         trainedFrom: etag, idempotencyKey: idempotencyKey, device: device, applyChange: applyChange)
    }

    /// Uploads a whole `.mlmodel` the device trained from the model whose ETag is `etag`; the server takes its
    /// updatable parameters (everything else must equal the user's base).
    public func upload(mlmodel: Data, trainedFrom etag: String, idempotencyKey: String,
                       device: String? = nil, samples: Int? = nil, loss: Double? = nil,
                       validationAccuracy: Double? = nil, validationSamples: Int? = nil,
                       applyChange: Bool = false) async throws -> UploadResult {
        try await upload(TrainedUpdate(mlmodel: mlmodel, samples: samples, loss: loss,
                                       validationAccuracy: validationAccuracy, validationSamples: validationSamples),
                         trainedFrom: etag, idempotencyKey: idempotencyKey, device: device, applyChange: applyChange)
    }

    /// Uploads a training result (see `upload(parameters:…)`).
    public func upload(_ update: TrainedUpdate, trainedFrom etag: String, idempotencyKey: String,
                       device: String? = nil, applyChange: Bool = false) async throws -> UploadResult {
        guard Self.isToken(idempotencyKey, maxLength: 100) else {
            throw AttuneUploadError.badRequest(reason: "the idempotency key must match [A-Za-z0-9_-]{1,100}")
        }
        if let device, !Self.isToken(device, maxLength: 64) {
            throw AttuneUploadError.badRequest(reason: "the device name must match [A-Za-z0-9_-]{1,64}")
        }
        var request = URLRequest(url: modelURL(query: [:]))
        request.httpMethod = "PUT"
        let body = update.body.data
        request.httpBody = body
        request.setValue(update.body.contentType, forHTTPHeaderField: "Content-Type")
        request.setValue(String(body.count), forHTTPHeaderField: "Content-Length")
        if applyChange {
            request.setValue("*", forHTTPHeaderField: "If-Match")
            request.setValue(etag, forHTTPHeaderField: "Attune-Trained-From")
        } else {
            request.setValue(etag, forHTTPHeaderField: "If-Match")
        }
        request.setValue(idempotencyKey, forHTTPHeaderField: "Idempotency-Key")
        if let device { request.setValue(device, forHTTPHeaderField: "Attune-Device") }
        if let samples = update.samples { request.setValue(String(samples), forHTTPHeaderField: "Attune-Samples") }
        if let loss = update.loss { request.setValue(String(loss), forHTTPHeaderField: "Attune-Loss") }
        if let accuracy = update.validationAccuracy {
            request.setValue(String(accuracy), forHTTPHeaderField: "Attune-Validation-Accuracy")
        }
        if let count = update.validationSamples {
            request.setValue(String(count), forHTTPHeaderField: "Attune-Validation-Samples")
        }

        let (data, response) = try await send(request)
        switch response.statusCode {
        case 200, 201:
            return try Self.uploadResult(data, response, idempotencyKey: idempotencyKey)
        case 400: throw AttuneUploadError.badRequest(reason: Self.text(data))
        case 401: throw AttuneUploadError.unauthorized
        case 403: throw AttuneUploadError.forbidden(reason: Self.text(data))
        case 409: throw AttuneUploadError.tooStale(reason: Self.text(data))
        case 412: throw AttuneUploadError.preconditionFailed(currentETag: response.value(forHTTPHeaderField: "ETag"))
        case 413: throw AttuneUploadError.tooLarge
        case 422: throw AttuneUploadError.unprocessable(reason: Self.text(data))
        case 428: throw AttuneUploadError.preconditionRequired
        case 503: throw AttuneUploadError.busy(retryAfter: Self.retryAfter(response))
        default: throw AttuneUploadError.unexpected(status: response.statusCode, body: Self.text(data))
        }
    }

    // MARK: Fetch, train, upload

    /// Fetches the user's newest model, calls `train` on it, and uploads the result trained from it, resolving a
    /// conflict (the line moved meanwhile: 412) by `policy`: `.retrain` fetches the new head and calls `train`
    /// again, at most `maxTrainingRuns` times in all; `.applyChange` has the server apply the change onto the head
    /// (and retrains if it is too stale for that). Each training result gets an idempotency key of its own, and a
    /// network error resends it with that key.
    ///
    /// After it returns, `fetch()` gets the new version's bytes as the server wrote them.
    /// - Throws: the training closure's error; `AttuneUploadError.preconditionFailed` when the line still moved after
    ///   `maxTrainingRuns` runs; any other `AttuneUploadError` or `AttuneFetchError` as it comes.
    public func sync<Output: DeviceTrainingOutput>(
        policy: ConflictPolicy = .retrain, maxTrainingRuns: Int = 3, device: String? = nil,
        train: (PersonalModel) async throws -> Output
    ) async throws -> SyncResult {
        var model = try await fetch().model
        var update = try await train(model).trainedUpdate
        var runs = 1
        while true {
            let current: String?
            do {
                let result = try await upload(update, trainedFrom: model.etag,
                                              idempotencyKey: Self.newIdempotencyKey(), device: device)
                return SyncResult(upload: result, trainedFrom: model, trainingRuns: runs, appliedChange: false)
            } catch AttuneUploadError.preconditionFailed(let etag) {
                current = etag
            }
            if policy == .applyChange {
                do {
                    // A new key: the request differs from the refused one (which made no version).
                    let result = try await upload(update, trainedFrom: model.etag,
                                                  idempotencyKey: Self.newIdempotencyKey(), device: device,
                                                  applyChange: true)
                    return SyncResult(upload: result, trainedFrom: model, trainingRuns: runs, appliedChange: true)
                } catch AttuneUploadError.tooStale {
                    // Too far behind to apply: train on the head instead.
                }
            }
            guard runs < maxTrainingRuns else { throw AttuneUploadError.preconditionFailed(currentETag: current) }
            model = try await fetchHead(atLeast: current, stale: model)
            update = try await train(model).trainedUpdate
            runs += 1
        }
    }

    /// Fetches until the model is at least `current` (the ETag a 412 named): a server answers fetches from a cache
    /// that its database's notification refreshes, which may come a moment after the version it announces.
    private func fetchHead(atLeast current: String?, stale: PersonalModel) async throws -> PersonalModel {
        let target = current.flatMap { ModelTag(etag: $0) }
        var model = try await fetch().model
        for _ in 0..<20 {
            guard let target else { return model }
            if model.etag == target.etag || model.tag.base != stale.tag.base
                || (model.tag.base == target.base && model.tag.version >= target.version) {
                return model
            }
            try await Task.sleep(nanoseconds: 100_000_000)
            model = try await fetch().model
        }
        return model
    }

    // MARK: HTTP

    /// Sends the request with a token; a network error sends it again (same headers, same idempotency key) up to
    /// `retry.maxAttempts`, and a 401 asks the token closure once more.
    private func send(_ base: URLRequest) async throws -> (Data, HTTPURLResponse) {
        var attempt = 1
        var askedAgain = false
        var bearer = try await token()
        while true {
            var request = base
            request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization")
            do {
                let (data, response) = try await session.data(for: request)
                guard let http = response as? HTTPURLResponse else {
                    throw AttuneUploadError.unexpected(status: 0, body: "not an HTTP response")
                }
                if http.statusCode == 401 && !askedAgain {
                    askedAgain = true
                    bearer = try await token()
                    continue
                }
                return (data, http)
            } catch let error as URLError where error.code != .cancelled && attempt < retry.maxAttempts {
                let delay = retry.initialDelay * pow(2, Double(attempt - 1))
                attempt += 1
                try await Task.sleep(nanoseconds: UInt64(delay * 1_000_000_000))
            }
        }
    }

    private func modelURL(query: [String: String]) -> URL {
        var components = URLComponents(url: baseURL, resolvingAgainstBaseURL: false)!
        var path = components.percentEncodedPath
        if path.hasSuffix("/") { path.removeLast() }
        path += "/v1/models/\(Self.segment(model))/users/\(Self.segment(user))"
        components.percentEncodedPath = path
        if !query.isEmpty {
            components.queryItems = query.keys.sorted().map { URLQueryItem(name: $0, value: query[$0]) }
        }
        return components.url!
    }

    private static func segment(_ s: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/;?#%")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? s
    }

    private static func isToken(_ s: String, maxLength: Int) -> Bool {
        !s.isEmpty && s.utf8.count <= maxLength && s.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x5F || b == 0x2D
        }
    }

    private static func text(_ data: Data) -> String {
        String(decoding: data.prefix(2048), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private static func retryAfter(_ response: HTTPURLResponse) -> TimeInterval? {
        response.value(forHTTPHeaderField: "Retry-After").flatMap { TimeInterval($0.trimmingCharacters(in: .whitespaces)) }
    }

    private struct CreatedBody: Decodable {
        let version: Int
        let etag: String
        let jobId: String
        let parentVersion: Int
        let held: String?
    }

    private static func uploadResult(_ data: Data, _ response: HTTPURLResponse, idempotencyKey: String) throws -> UploadResult {
        let body: CreatedBody
        do {
            body = try JSONDecoder().decode(CreatedBody.self, from: data)
        } catch {
            throw AttuneUploadError.unexpected(status: response.statusCode, body: text(data))
        }
        let replayed = response.value(forHTTPHeaderField: "Idempotent-Replayed")?.lowercased() == "true"
        return UploadResult(version: body.version, etag: response.value(forHTTPHeaderField: "ETag") ?? body.etag,
                            parentVersion: body.parentVersion, jobId: body.jobId, replayed: replayed,
                            idempotencyKey: idempotencyKey, held: body.held)
    }
}
