import Foundation

/// What the operators' page takes from one worker's `/metrics` (Prometheus' text format): the worker's own
/// account of its slots, the deliveries in its hand and the jobs it settled, beside its name, release and kernels.
struct WorkerMetricsReading: Sendable, Equatable {
    var worker: String?
    var release: String?
    /// The kernels it trains with, as `attune_training_kernels_info`'s labels say (`kernels=…`, `isa=…`).
    var kernels: String?
    var slots = 0
    var busySlots = 0
    var deliveriesInHand = 0
    /// Jobs settled since the worker started (every outcome but a hand-back): a counter, for a rate.
    var jobsSettled = 0.0

    /// Reads the lines it knows and skips every other one; nil when none of Attune's is there (not a worker).
    init?(text: String) {
        var seen = false
        var slotStates: [String: Bool] = [:]
        for line in text.split(whereSeparator: \.isNewline) where !line.hasPrefix("#") {
            guard let sample = Self.sample(String(line)) else { continue }
            switch sample.name {
            case "attune_worker_info":
                worker = sample.labels["worker"]
                seen = true
            case "attune_build_info":
                release = sample.labels["version"]
                seen = true
            case "attune_training_kernels_info":
                kernels = sample.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            case "attune_slot_state":
                guard let slot = sample.labels["slot"], let state = sample.labels["state"] else { continue }
                if sample.value == 1 && state != "idle" { slotStates[slot] = true } else if slotStates[slot] == nil { slotStates[slot] = false }
            case "attune_deliveries_in_hand":
                deliveriesInHand = Int(sample.value)
            case "attune_jobs_total":
                if sample.labels["outcome"] != "handed_back" { jobsSettled += sample.value }
            default:
                continue
            }
        }
        guard seen else { return nil }
        slots = slotStates.count
        busySlots = slotStates.values.filter { $0 }.count
    }

    struct Sample {
        let name: String
        let labels: [String: String]
        let value: Double
    }

    /// One sample line: `name{label="value",…} value [timestamp]`, label values with `\"`, `\\` and `\n` escapes.
    static func sample(_ line: String) -> Sample? {
        let characters = Array(line)
        var index = 0
        while index < characters.count, characters[index] != "{", characters[index] != " " { index += 1 }
        let name = String(characters[0..<index])
        guard !name.isEmpty else { return nil }
        var labels: [String: String] = [:]
        if index < characters.count, characters[index] == "{" {
            index += 1
            while index < characters.count, characters[index] != "}" {
                var key = ""
                while index < characters.count, characters[index] != "=" { key.append(characters[index]); index += 1 }
                index += 1  // =
                guard index < characters.count, characters[index] == "\"" else { return nil }
                index += 1
                var value = ""
                while index < characters.count, characters[index] != "\"" {
                    if characters[index] == "\\", index + 1 < characters.count {
                        index += 1
                        value.append(characters[index] == "n" ? "\n" : characters[index])
                    } else {
                        value.append(characters[index])
                    }
                    index += 1
                }
                index += 1  // closing quote
                labels[key.trimmingCharacters(in: .whitespaces)] = value
                if index < characters.count, characters[index] == "," { index += 1 }
            }
            index += 1  // }
        }
        let fields = String(characters[min(index, characters.count)...]).split(separator: " ")
        guard let first = fields.first, let value = Double(first) else { return nil }
        return Sample(name: name, labels: labels, value: value)
    }
}
