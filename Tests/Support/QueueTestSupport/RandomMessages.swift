import AttuneSpec
import Foundation

/// Seeded so a failing case can be replayed: the seed is in every failure message.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Random messages that reach every branch of the hand-written encoders.
struct RandomMessages {
    var rng: SplitMix64

    init(seed: UInt64) { rng = SplitMix64(seed: seed) }

    mutating func bool() -> Bool { Bool.random(using: &rng) }
    mutating func int(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &rng) }

    /// Edge values first (zero, negative zero, infinities, NaNs with payloads, extremes, integral values
    /// that print with and without exponents), then arbitrary bit patterns and everyday magnitudes.
    mutating func double() -> Double {
        let edges: [Double] = [0, -0.0, 1, -1, 16, 0.1, 1e-7, 1e16, 1e17, 123456789012345680, -2.5e-300,
                               .infinity, -.infinity, .nan, -Double.nan, Double(bitPattern: 0x7FF8_0000_0000_0BAD),
                               .greatestFiniteMagnitude, -.greatestFiniteMagnitude, .leastNonzeroMagnitude,
                               .leastNormalMagnitude, .ulpOfOne, 9007199254740992, 4.35, 0.30000000000000004]
        switch int(0...5) {
        case 0: return edges[int(0...edges.count - 1)]
        case 1: return Double(bitPattern: rng.next())
        case 2: return Double(int(-1_000_000...1_000_000))
        case 3: return Double(int(0...16))
        case 4: return Double.random(in: -1e-3...1e-3, using: &rng)
        default: return Double.random(in: -1e6...1e6, using: &rng) * pow(10, Double(int(-30...30)))
        }
    }

    mutating func int64() -> Int64 {
        switch int(0...4) {
        case 0: return [0, 1, -1, 127, 128, Int64.max, Int64.min, 16383, 16384][int(0...8)]
        case 1: return Int64(bitPattern: rng.next())
        case 2: return Int64(int(-300...300))
        case 3: return Int64(bitPattern: rng.next() >> UInt64(int(1...63)))
        default: return Int64(int(0...1_000_000_000))
        }
    }

    /// Quotes, backslashes, every C0 control, DEL, C1 controls, the JSON-hostile U+2028, accents both
    /// precomposed and combining (so sorting of canonically equivalent keys is exercised), CJK, emoji.
    mutating func string(maxLength: Int = 12) -> String {
        let pool: [Unicode.Scalar] = ["a", "Z", "0", "_", "-", ".", " ", "\"", "\\", "/", "\u{7F}", "\u{80}",
                                      "\u{85}", "\u{9F}", "\u{A0}", "é", "e", "\u{301}", "ß", "\u{2028}",
                                      "\u{FEFF}", "中", "\u{10FFFF}", "😀", "\u{1F1FA}", "\u{FFFD}"]
        var scalars = String.UnicodeScalarView()
        for _ in 0..<int(0...maxLength) {
            if int(0...5) == 0 {
                scalars.append(Unicode.Scalar(UInt8(int(0...31))))
            } else {
                scalars.append(pool[int(0...pool.count - 1)])
            }
        }
        return String(scalars)
    }

    mutating func featureValue() -> Attune_V1_FeatureValue {
        var value = Attune_V1_FeatureValue()
        switch int(0...6) {
        case 0: value.doubleValue = double()
        case 1: value.int64Value = int64()
        case 2: value.stringValue = string()
        case 3: value.image = Data((0..<int(0...300)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        case 4: break  // no kind set: an empty FeatureValue message
        default:
            var array = Attune_V1_MultiArray()
            if bool() { array.shape = (0..<int(0...4)).map { _ in int64() } }
            array.values = (0..<int(0...200)).map { _ in double() }
            value.multiArray = array
        }
        return value
    }

    mutating func parameters() -> Attune_V1_UpdateParameters {
        var p = Attune_V1_UpdateParameters()
        if bool() { p.epochs = int64() }
        if bool() { p.learningRate = double() }
        if bool() { p.miniBatchSize = int64() }
        if bool() { p.momentum = double() }
        if bool() { p.beta1 = double() }
        if bool() { p.beta2 = double() }
        if bool() { p.eps = double() }
        if bool() { p.shuffle = bool() }
        if bool() { p.seed = int64() }
        if bool() { p.k = int64() }
        return p
    }

    mutating func job() -> Attune_V1_TrainingJob {
        var job = Attune_V1_TrainingJob()
        if bool() { job.jobID = string() }
        if bool() { job.userID = string(maxLength: 130) }
        if bool() { job.model = string() }
        if bool() { job.baseVersion = int64() }
        for _ in 0..<int(0...6) { job.samples.append(sample()) }
        if bool() { job.parameters = parameters() }
        if bool() { for _ in 0..<int(0...3) { job.validationSamples.append(sample()) } }
        return job
    }

    mutating func sample() -> Attune_V1_Sample {
        var sample = Attune_V1_Sample()
        for _ in 0..<int(0...5) { sample.features[string(maxLength: 4)] = featureValue() }
        return sample
    }

    mutating func event() -> Attune_V1_Event {
        var event = Attune_V1_Event()
        let kinds: [Attune_V1_EventKind] = [.unspecified, .trainingBegin, .epochEnd, .miniBatchEnd, .completed,
                                            .failed, .cancelled, .UNRECOGNIZED(7), .UNRECOGNIZED(-3), .UNRECOGNIZED(2)]
        if bool() { event.kind = kinds[int(0...kinds.count - 1)] }
        if bool() { event.jobID = string() }
        if bool() { event.userID = string() }
        if bool() { event.model = string() }
        if bool() { event.version = int64() }
        if bool() { event.epoch = int64() }
        if bool() { event.epochs = int64() }
        if bool() { event.miniBatch = int64() }
        if bool() { event.loss = double() }
        if bool() { event.samples = int64() }
        if bool() { event.durationSeconds = double() }
        if bool() { event.reason = string(maxLength: 40) }
        if bool() { event.willRetry = bool() }
        if bool() { event.worker = string() }
        if bool() { event.timestampMs = int64() }
        if bool() { event.duplicate = bool() }
        if bool() { event.cancelStage = string(maxLength: 12) }
        if bool() { event.validationLoss = double() }
        if bool() { event.validationAccuracy = double() }
        if bool() {
            event.epochMetrics = (0..<int(0...4)).map { _ in
                var epoch = Attune_V1_EpochMetrics()
                if bool() { epoch.epoch = int64() }
                if bool() { epoch.loss = double() }
                if bool() { epoch.validationLoss = double() }
                if bool() { epoch.validationAccuracy = double() }
                return epoch
            }
        }
        return event
    }
}

/// A digits job as producers send it: 8×8 images of values 0…16 and a string label.
func digitsJob(samples: Int = 20, seed: UInt64 = 1) -> Attune_V1_TrainingJob {
    var random = RandomMessages(seed: seed)
    var job = Attune_V1_TrainingJob()
    job.jobID = "job-\(seed)"
    job.userID = "user-42"
    job.model = "digits-mlp"
    job.baseVersion = 1
    for _ in 0..<samples {
        var image = Attune_V1_FeatureValue()
        var array = Attune_V1_MultiArray()
        array.shape = [64]
        array.values = (0..<64).map { _ in Double(random.int(0...16)) }
        image.multiArray = array
        var label = Attune_V1_FeatureValue()
        label.stringValue = String(random.int(0...9))
        var sample = Attune_V1_Sample()
        sample.features = ["image": image, "label": label]
        job.samples.append(sample)
    }
    job.parameters.epochs = 10
    job.parameters.learningRate = 0.01
    return job
}

/// A typical mid-training event.
func epochEndEvent() -> Attune_V1_Event {
    var event = Attune_V1_Event()
    event.kind = .epochEnd
    event.jobID = "job-1"
    event.userID = "user-42"
    event.model = "digits-mlp"
    event.epoch = 3
    event.epochs = 10
    event.loss = 0.4821935123
    event.samples = 20
    event.durationSeconds = 0.0123
    event.worker = "worker-7@host-3"
    event.timestampMs = 1_790_000_000_123
    return event
}
