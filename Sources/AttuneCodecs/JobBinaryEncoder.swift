import AttuneSpec
import Foundation
import SwiftProtobuf

/// SwiftProtobuf's deterministic binary form of a training job, written without its generic visitors.
///
/// `JobDigest` hashes these bytes and the digests are stored and compared across releases, so every
/// rule below mirrors what SwiftProtobuf 1.x does, not merely what the protobuf spec allows: proto3
/// defaults omitted, oneof and `optional` fields written whenever set (zero included), packed repeated
/// scalars, map entries sorted with `String.<` and always carrying both key and value, fields in number
/// order. Unknown fields are the one thing left to SwiftProtobuf: the caller falls back when this
/// encoder returns nil.
enum JobBinaryEncoder {
    /// The deterministic bytes of `job` (with `job_id` left out when `omittingJobID`), or nil when some
    /// message in it carries unknown fields.
    static func deterministicBytes(_ job: Attune_V1_TrainingJob, omittingJobID: Bool) -> [UInt8]? {
        guard job.unknownFields.data.isEmpty, let samples = sortedSamples(job.samples),
              let validation = sortedSamples(job.validationSamples) else { return nil }
        var parametersSize: Int?
        if job.hasParameters {
            // A learning-rate schedule is rare enough to leave to SwiftProtobuf.
            guard job.parameters.unknownFields.data.isEmpty, !job.parameters.hasLearningRateSchedule else { return nil }
            parametersSize = Self.parametersSize(job.parameters)
        }

        var total = 0
        if !omittingJobID && !job.jobID.isEmpty { total += delimitedSize(job.jobID.utf8.count) }
        if !job.userID.isEmpty { total += delimitedSize(job.userID.utf8.count) }
        if !job.model.isEmpty { total += delimitedSize(job.model.utf8.count) }
        if job.baseVersion != 0 { total += 1 + varintSize(job.baseVersion) }
        for size in samples.sizes { total += delimitedSize(size) }
        if let parametersSize { total += delimitedSize(parametersSize) }
        for size in validation.sizes { total += delimitedSize(size) }

        return [UInt8](unsafeUninitializedCapacity: total) { buffer, count in
            var out = ProtoWriter(buffer.baseAddress!)
            if !omittingJobID && !job.jobID.isEmpty { out.string(job.jobID, field: 1) }
            if !job.userID.isEmpty { out.string(job.userID, field: 2) }
            if !job.model.isEmpty { out.string(job.model, field: 3) }
            if job.baseVersion != 0 { out.int64(job.baseVersion, field: 4) }
            for (entries, size) in zip(samples.entries, samples.sizes) {
                out.header(field: 5, length: size)
                for entry in entries { writeEntry(entry.key, entry.value, to: &out) }
            }
            if let parametersSize {
                out.header(field: 6, length: parametersSize)
                writeParameters(job.parameters, to: &out)
            }
            for (entries, size) in zip(validation.entries, validation.sizes) {
                out.header(field: 7, length: size)
                for entry in entries { writeEntry(entry.key, entry.value, to: &out) }
            }
            count = out.written(since: buffer.baseAddress!)
            // A size that disagrees with what was written would hash the wrong bytes (or worse): stop.
            precondition(count == total, "JobBinaryEncoder sized \(total) bytes but wrote \(count)")
        }
    }

    /// Each sample's features sorted by key (sorting once serves both the sizing and the writing pass) and
    /// its encoded size; nil when some message in them carries unknown fields.
    static func sortedSamples(_ list: [Attune_V1_Sample])
        -> (entries: [[(key: String, value: Attune_V1_FeatureValue)]], sizes: [Int])? {
        var sorted: [[(key: String, value: Attune_V1_FeatureValue)]] = []
        sorted.reserveCapacity(list.count)
        var sizes: [Int] = []
        sizes.reserveCapacity(list.count)
        for sample in list {
            guard sample.unknownFields.data.isEmpty else { return nil }
            let entries = sample.features.sorted { $0.key < $1.key }
            var size = 0
            for entry in entries {
                guard let valueSize = featureValueSize(entry.value) else { return nil }
                size += delimitedSize(entrySize(key: entry.key, valueSize: valueSize))
            }
            sorted.append(entries)
            sizes.append(size)
        }
        return (sorted, sizes)
    }

    // MARK: sizes

    @inline(__always) static func varintSize(_ value: UInt64) -> Int {
        value < 0x80 ? 1 : (64 - value.leadingZeroBitCount + 6) / 7
    }

    @inline(__always) static func varintSize(_ value: Int64) -> Int {
        varintSize(UInt64(bitPattern: value))
    }

    /// Tag (one byte: every field number here is below 16), length, payload.
    @inline(__always) static func delimitedSize(_ length: Int) -> Int {
        1 + varintSize(UInt64(length)) + length
    }

    @inline(__always) static func entrySize(key: String, valueSize: Int) -> Int {
        delimitedSize(key.utf8.count) + delimitedSize(valueSize)
    }

    static func featureValueSize(_ value: Attune_V1_FeatureValue) -> Int? {
        guard value.unknownFields.data.isEmpty else { return nil }
        switch value.kind {
        case nil: return 0
        case .doubleValue: return 9
        case .int64Value(let v): return 1 + varintSize(v)
        case .stringValue(let s): return delimitedSize(s.utf8.count)
        case .image(let bytes): return delimitedSize(bytes.count)
        case .multiArray(let array):
            guard array.unknownFields.data.isEmpty else { return nil }
            return delimitedSize(multiArraySize(array))
        }
    }

    static func multiArraySize(_ array: Attune_V1_MultiArray) -> Int {
        var size = 0
        if !array.shape.isEmpty { size += delimitedSize(packedSize(array.shape)) }
        if !array.values.isEmpty { size += delimitedSize(array.values.count * 8) }
        return size
    }

    @inline(__always) static func packedSize(_ values: [Int64]) -> Int {
        values.reduce(0) { $0 + varintSize($1) }
    }

    static func parametersSize(_ p: Attune_V1_UpdateParameters) -> Int {
        var size = 0
        if p.hasEpochs { size += 1 + varintSize(p.epochs) }
        if p.hasLearningRate { size += 9 }
        if p.hasMiniBatchSize { size += 1 + varintSize(p.miniBatchSize) }
        if p.hasMomentum { size += 9 }
        if p.hasBeta1 { size += 9 }
        if p.hasBeta2 { size += 9 }
        if p.hasEps { size += 9 }
        if p.hasShuffle { size += 2 }
        if p.hasSeed { size += 1 + varintSize(p.seed) }
        if p.hasK { size += 1 + varintSize(p.k) }
        return size
    }

    // MARK: writing

    static func writeEntry(_ key: String, _ value: Attune_V1_FeatureValue, to out: inout ProtoWriter) {
        // Sizes were checked (and unknown fields refused) in the sizing pass.
        let valueSize = featureValueSize(value)!
        out.header(field: 1, length: entrySize(key: key, valueSize: valueSize))
        out.string(key, field: 1)
        out.header(field: 2, length: valueSize)
        switch value.kind {
        case nil: break
        case .doubleValue(let v): out.double(v, field: 1)
        case .int64Value(let v): out.int64(v, field: 2)
        case .stringValue(let s): out.string(s, field: 3)
        case .image(let bytes):
            out.header(field: 5, length: bytes.count)
            bytes.withUnsafeBytes { out.raw($0) }
        case .multiArray(let array):
            out.header(field: 4, length: multiArraySize(array))
            if !array.shape.isEmpty {
                out.header(field: 1, length: packedSize(array.shape))
                for dimension in array.shape { out.varint(UInt64(bitPattern: dimension)) }
            }
            if !array.values.isEmpty {
                out.header(field: 2, length: array.values.count * 8)
                out.packedDoubles(array.values)
            }
        }
    }

    static func writeParameters(_ p: Attune_V1_UpdateParameters, to out: inout ProtoWriter) {
        if p.hasEpochs { out.int64(p.epochs, field: 1) }
        if p.hasLearningRate { out.double(p.learningRate, field: 2) }
        if p.hasMiniBatchSize { out.int64(p.miniBatchSize, field: 3) }
        if p.hasMomentum { out.double(p.momentum, field: 4) }
        if p.hasBeta1 { out.double(p.beta1, field: 5) }
        if p.hasBeta2 { out.double(p.beta2, field: 6) }
        if p.hasEps { out.double(p.eps, field: 7) }
        if p.hasShuffle { out.int64(p.shuffle ? 1 : 0, field: 8) }
        if p.hasSeed { out.int64(p.seed, field: 9) }
        if p.hasK { out.int64(p.k, field: 10) }
    }
}

/// Appends protobuf wire primitives to memory the caller sized exactly.
struct ProtoWriter {
    private var cursor: UnsafeMutablePointer<UInt8>

    init(_ start: UnsafeMutablePointer<UInt8>) { cursor = start }

    func written(since start: UnsafeMutablePointer<UInt8>) -> Int { cursor - start }

    @inline(__always) mutating func byte(_ b: UInt8) {
        cursor.pointee = b
        cursor += 1
    }

    @inline(__always) mutating func varint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            byte(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        byte(UInt8(v))
    }

    @inline(__always) mutating func tag(_ field: Int, wireType: UInt8) {
        byte(UInt8(field << 3) | wireType)
    }

    @inline(__always) mutating func header(field: Int, length: Int) {
        tag(field, wireType: 2)
        varint(UInt64(length))
    }

    @inline(__always) mutating func int64(_ value: Int64, field: Int) {
        tag(field, wireType: 0)
        varint(UInt64(bitPattern: value))
    }

    @inline(__always) mutating func double(_ value: Double, field: Int) {
        tag(field, wireType: 1)
        storeLittleEndian(value.bitPattern)
    }

    @inline(__always) mutating func storeLittleEndian(_ bits: UInt64) {
        UnsafeMutableRawPointer(cursor).storeBytes(of: bits.littleEndian, as: UInt64.self)
        cursor += 8
    }

    mutating func raw(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        UnsafeMutableRawPointer(cursor).copyMemory(from: base, byteCount: bytes.count)
        cursor += bytes.count
    }

    mutating func string(_ s: String, field: Int) {
        let utf8 = s.utf8
        header(field: field, length: utf8.count)
        let copied: Void? = utf8.withContiguousStorageIfAvailable { raw(UnsafeRawBufferPointer($0)) }
        if copied == nil { for b in utf8 { byte(b) } }
    }

    mutating func packedDoubles(_ values: [Double]) {
        #if _endian(little)
        // The wire form of a packed double is its little-endian bit pattern: the array's own memory.
        values.withUnsafeBytes { raw($0) }
        #else
        for v in values { storeLittleEndian(v.bitPattern) }
        #endif
    }
}
