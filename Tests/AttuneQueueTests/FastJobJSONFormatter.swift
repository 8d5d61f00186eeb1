import AttuneSpec
import Foundation

/// Writes a job as JSON the way a hand-rolled producer might: other spacing, snake_case names, int64s
/// bare or quoted, doubles in many spellings, strings with every escape. The text need not reproduce
/// the job exactly; both decoders read the same bytes and must agree.
struct JobFormatter<R: RandomNumberGenerator> {
    var rng: R
    var snakeCase = false
    var spaced = false
    /// Quoted doubles and integers in float form are legal but deferred to SwiftProtobuf; one of them
    /// sends the whole job there, so they are opt-in to keep most rounds on the fast path.
    var deferredForms = false

    mutating func json(_ job: Attune_V1_TrainingJob) -> String {
        var members: [(String, String)] = []
        if !job.jobID.isEmpty || coin() { members.append((name("jobId", "job_id"), string(job.jobID))) }
        members.append((name("userId", "user_id"), string(job.userID)))
        members.append(("model", string(job.model)))
        if job.baseVersion != 0 || coin() { members.append((name("baseVersion", "base_version"), int64(job.baseVersion))) }
        if !job.samples.isEmpty || coin() {
            members.append(("samples", list(job.samples.map { sample in
                object([("\"features\"", object(sample.features.sorted { $0.key < $1.key }.map { (string($0.key), featureValue($0.value)) }))])
            })))
        }
        if !job.validationSamples.isEmpty {
            members.append((name("validationSamples", "validation_samples"), list(job.validationSamples.map { sample in
                object([("\"features\"", object(sample.features.sorted { $0.key < $1.key }.map { (string($0.key), featureValue($0.value)) }))])
            })))
        }
        if job.hasParameters { members.append(("parameters", parameters(job.parameters))) }
        members.shuffle(using: &rng)
        return object(members.map { ($0.0.hasPrefix("\"") ? $0.0 : "\"\($0.0)\"", $0.1) })
    }

    private mutating func coin() -> Bool { Bool.random(using: &rng) }

    private mutating func name(_ camel: String, _ snake: String) -> String {
        snakeCase || (coin() && coin()) ? snake : camel
    }

    private mutating func featureValue(_ value: Attune_V1_FeatureValue) -> String {
        switch value.kind {
        case .doubleValue(let v)?: return object([(key("doubleValue", "double_value"), double(v))])
        case .int64Value(let v)?: return object([(key("int64Value", "int64_value"), int64(v))])
        case .stringValue(let v)?: return object([(key("stringValue", "string_value"), string(v))])
        case .multiArray(let a)?:
            var members = [("\"shape\"", list(a.shape.map { int64($0) })), ("\"values\"", list(a.values.map { double($0) }))]
            if coin() { members.shuffle(using: &rng) }
            return object([(key("multiArray", "multi_array"), object(members))])
        case .image(let data)?: return object([("\"image\"", "\"\(data.base64EncodedString())\"")])
        case nil: return object([])
        }
    }

    private mutating func key(_ camel: String, _ snake: String) -> String { "\"\(name(camel, snake))\"" }

    private mutating func parameters(_ p: Attune_V1_UpdateParameters) -> String {
        var m: [(String, String)] = []
        if p.hasEpochs { m.append((key("epochs", "epochs"), int64(p.epochs))) }
        if p.hasLearningRate { m.append((key("learningRate", "learning_rate"), double(p.learningRate))) }
        if p.hasMiniBatchSize { m.append((key("miniBatchSize", "mini_batch_size"), int64(p.miniBatchSize))) }
        if p.hasMomentum { m.append(("\"momentum\"", double(p.momentum))) }
        if p.hasBeta1 { m.append(("\"beta1\"", double(p.beta1))) }
        if p.hasBeta2 { m.append(("\"beta2\"", double(p.beta2))) }
        if p.hasEps { m.append(("\"eps\"", double(p.eps))) }
        if p.hasShuffle { m.append(("\"shuffle\"", p.shuffle ? "true" : "false")) }
        if p.hasSeed { m.append(("\"seed\"", int64(p.seed))) }
        if p.hasK { m.append(("\"k\"", int64(p.k))) }
        return object(m)
    }

    private mutating func gap() -> String {
        spaced ? ["", " ", "\n  ", "\t", "\r\n"].randomElement(using: &rng)! : ""
    }

    private mutating func object(_ members: [(String, String)]) -> String {
        var parts: [String] = []
        for (k, v) in members { parts.append(gap() + k + gap() + ":" + gap() + v + gap()) }
        return "{" + parts.joined(separator: ",") + gap() + "}"
    }

    private mutating func list(_ items: [String]) -> String {
        var parts: [String] = []
        for item in items { parts.append(gap() + item + gap()) }
        return "[" + parts.joined(separator: ",") + gap() + "]"
    }

    private mutating func int64(_ v: Int64) -> String {
        switch Int.random(in: 0..<(deferredForms ? 5 : 3), using: &rng) {
        case 0: return "\(v)"
        case 1: return "\"\(v)\""
        case 2: return v == 0 ? "-0" : "\(v)"
        case 3: return v >= 0 && v < 1000 ? "\(v).0" : "\(v)"   // float form: SwiftProtobuf reads it, we defer
        default: return v >= 0 && v < 100 && v % 10 == 0 && v > 0 ? "\(v / 10)e1" : "\"\(v)\""
        }
    }

    private mutating func double(_ v: Double) -> String {
        switch Int.random(in: 0..<(deferredForms ? 8 : 7), using: &rng) {
        case 0: return "\(v)"                                       // Swift: 5.0, 1e-05, -0.0, 1e+100
        case 1: return String(format: "%.17g", v)
        case 2: return String(format: "%.\(Int.random(in: 0...20, using: &rng))e", v)
        case 3 where abs(v) < 1e20:  // %f of 1e300 is over the 127 characters SwiftProtobuf reads
            return String(format: "%.\(Int.random(in: 0...25, using: &rng))f", v)
        case 4: return v == v.rounded() && abs(v) < 1e15 ? String(Int64(v)) : "\(v)"
        case 5: return String(format: "%.\(Int.random(in: 1...16, using: &rng))g", v).replacingOccurrences(of: "e+", with: "E")
        case 6: return "\(v)".replacingOccurrences(of: "-0.0", with: "-0")
        case 7: return "\"\(v)\""                                 // quoted: legal, deferred
        default: return "\(v)"
        }
    }

    private mutating func string(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "/": out += coin() ? "\\/" : "/"
            case "\n": out += coin() ? "\\n" : "\\u000a"
            case "\t": out += "\\t"
            case "\u{8}": out += "\\b"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04X", scalar.value)
            case _ where scalar.value >= 0x80 && coin():
                for unit in String(scalar).utf16 { out += String(format: coin() ? "\\u%04x" : "\\u%04X", unit) }
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
