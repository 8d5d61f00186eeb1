import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import XCTest
@testable import WorkerTestSupport
import AttuneCodecs
import SwiftProtobuf

/// Jobs with validation samples through a real worker: every `epoch_end` carries the epoch's validation
/// loss and accuracy, `completed` the last ones, the version records them and `attune model history`
/// (text and --json) shows them; jobs without any carry none; malformed ones are dead-lettered naming
/// `validationSamples`; `attune enqueue` attaches a validation set.
final class ValidationSetWorkerTests: XCTestCase {
    func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> String {
        let result = try ChildProcess.run(Paths.attuneExecutable, arguments, environment: [
            "ATTUNE_DATABASE_URL": fleet.databaseURL, "ATTUNE_AMQP_URL": fleet.amqpURL])
        XCTAssertEqual(result.status, 0, result.output)
        return result.output
    }

    func headState(_ fleet: FleetHarness, user: String, model: String, version: Int) throws -> Attune_V1_UpdateState {
        try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(user: user, model: model,
                                                                                   version: version).state)
    }

    func testMetricsAreReportedEachEpochRecordedAndShownInHistory() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let dir = try XCTUnwrap(ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"],
                                "ATTUNE_TEST_FIXTURES is not set: run scripts/test.sh")
        let knnBytes = try Data(contentsOf: URL(fileURLWithPath: dir).appendingPathComponent("digits-knn.mlmodel"))
        let knnName = "knn_" + UUID().uuidString.prefix(8).lowercased()
        _ = try fleet.registry.importBaseModel(name: knnName, kind: "kNearestNeighborsClassifier", bytes: knnBytes)
        fleet.startWorker(fleet.configuration())

        let held = (60..<100).map { Digits.sample($0) }
        var validated = Digits.job(user: "vera", model: fleet.model, rows: 0..<60, epochs: 3)
        validated.validationSamples = held
        let plain = Digits.job(user: "vera", model: fleet.model, rows: 100..<130, epochs: 3)
        var knn = Digits.job(user: "kim", model: knnName, rows: 0..<60, epochs: nil)
        knn.validationSamples = held
        try fleet.publish(validated, as: .json)   // the fast JSON reader
        try fleet.publish(plain, as: .protobuf)
        try fleet.publish(knn, as: .protobuf)
        let events = try fleet.events(untilEnded: 3)

        // The network: both metrics at every epoch's end, the last ones again in `completed`.
        let mine = events.filter { $0.jobID == validated.jobID }
        let epochEnds = FleetHarness.epochsReported(events, job: validated.jobID)
        XCTAssertEqual(epochEnds.map(\.epoch), [1, 2, 3])
        XCTAssertTrue(epochEnds.allSatisfy { $0.hasValidationLoss && $0.hasValidationAccuracy }, "\(epochEnds)")
        XCTAssertTrue(epochEnds.allSatisfy { $0.validationLoss > 0 && (0...1).contains($0.validationAccuracy) })
        print("through the worker: validation accuracy per epoch \(epochEnds.map(\.validationAccuracy)), "
            + "loss \(epochEnds.map(\.validationLoss))")
        let completed = try XCTUnwrap(mine.last, "\(mine.map(\.kind))")
        XCTAssertEqual(completed.kind, .completed, completed.reason)
        XCTAssertEqual(completed.validationLoss, epochEnds.last?.validationLoss)
        XCTAssertEqual(completed.validationAccuracy, epochEnds.last?.validationAccuracy)
        XCTAssertEqual(completed.samples, 60, "validation samples are not training samples")
        XCTAssertTrue(mine.filter { $0.kind != .epochEnd && $0.kind != .completed }
            .allSatisfy { !$0.hasValidationLoss && !$0.hasValidationAccuracy })
        // The last figure is the committed version's: what `attune model evaluate` says of it.
        let base = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Paths.digitsModel)))
        XCTAssertEqual(completed.validationAccuracy,
                       try base.accuracy(samples: held, state: headState(fleet, user: "vera", model: fleet.model, version: 1)))

        // Without validation samples: no metric anywhere.
        let others = events.filter { $0.jobID == plain.jobID }
        XCTAssertEqual(others.last?.kind, .completed)
        XCTAssertTrue(others.allSatisfy { !$0.hasValidationLoss && !$0.hasValidationAccuracy }, "\(others)")

        // The k-NN: accuracy (predicted by the version it made), no loss.
        let knnEvents = events.filter { $0.jobID == knn.jobID }
        let knnEnd = try XCTUnwrap(FleetHarness.epochsReported(knnEvents, job: knn.jobID).first)
        let knnCompleted = try XCTUnwrap(knnEvents.last)
        XCTAssertEqual(knnCompleted.kind, .completed, knnCompleted.reason)
        XCTAssertFalse(knnEnd.hasValidationLoss, "a k-NN has no loss")
        XCTAssertTrue(knnEnd.hasValidationAccuracy)
        XCTAssertFalse(knnCompleted.hasValidationLoss, "a k-NN has no loss")
        XCTAssertTrue(knnCompleted.hasValidationAccuracy)
        let knnBase = try UpdatableModel(spec: ModelFile.decode(knnBytes))
        XCTAssertEqual(knnCompleted.validationAccuracy,
                       try knnBase.accuracy(samples: held, state: headState(fleet, user: "kim", model: knnName, version: 1)))
        XCTAssertGreaterThan(knnCompleted.validationAccuracy, 0.7)

        // The versions record them.
        let history = try fleet.registry.history(user: "vera", model: fleet.model)
        XCTAssertEqual(history.map(\.jobId), [validated.jobID, plain.jobID])
        // JSONDecoder, not JSONSerialization: on Linux the latter reads about half of all doubles an ulp off.
        struct Record: Decodable { let samples: Int; let loss: Double?; let accuracy: Double? }
        let record = try JSONDecoder().decode(Record.self, from: Data(XCTUnwrap(history[0].validation).utf8))
        XCTAssertEqual(record.samples, 40)
        XCTAssertEqual(record.loss, completed.validationLoss)
        XCTAssertEqual(record.accuracy, completed.validationAccuracy)
        XCTAssertNil(history[1].validation)

        // `attune model history`: two columns, blank without a validation set, — for a metric the model lacks.
        let text = try attune(fleet, ["model", "history", "--name", fleet.model, "--user", "vera"])
        print(text)
        let lines = text.split(separator: "\n").map(String.init)
        XCTAssertTrue(lines[0].contains("LOSS      VAL LOSS  VAL ACC  SECONDS"), lines[0])
        let offset = lines[0].distance(from: lines[0].startIndex, to: lines[0].range(of: "VAL LOSS")!.lowerBound)
        func cell(_ line: String, from: Int, width: Int) -> String {
            let start = line.index(line.startIndex, offsetBy: from)
            return String(line[start..<line.index(start, offsetBy: width)]).trimmingCharacters(in: .whitespaces)
        }
        XCTAssertEqual(cell(lines[1], from: offset, width: 10), String(format: "%.4f", completed.validationLoss))
        XCTAssertEqual(cell(lines[1], from: offset + 10, width: 9), String(format: "%.3f", completed.validationAccuracy))
        XCTAssertEqual(cell(lines[2], from: offset, width: 19), "", "blank without a validation set")
        let knnText = try attune(fleet, ["model", "history", "--name", knnName, "--user", "kim"])
        XCTAssertTrue(knnText.contains("—         —         " + String(format: "%.3f", knnCompleted.validationAccuracy)),
                      knnText)

        // --json: every version has the keys, null where there is nothing.
        let json = try attune(fleet, ["model", "history", "--name", fleet.model, "--user", "vera", "--json"])
        let objects = try json.split(separator: "\n").map {
            try XCTUnwrap(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        XCTAssertEqual(objects.count, 2)
        struct Printed: Decodable { let validationSamples: Int?; let validationLoss: Double?; let validationAccuracy: Double? }
        let printed = try JSONDecoder().decode(Printed.self, from: Data(json.split(separator: "\n")[0].utf8))
        XCTAssertEqual(printed.validationSamples, 40)
        XCTAssertEqual(printed.validationLoss, completed.validationLoss)
        XCTAssertEqual(printed.validationAccuracy, completed.validationAccuracy)
        for key in ["validationSamples", "validationLoss", "validationAccuracy"] {
            XCTAssertTrue(objects[1][key] is NSNull, "\(key): \(objects[1])")
        }
        let knnJSON = try attune(fleet, ["model", "history", "--name", knnName, "--user", "kim", "--json"])
        let knnObject = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(knnJSON.utf8)) as? [String: Any])
        XCTAssertTrue(knnObject["validationLoss"] is NSNull)
        let knnPrinted = try JSONDecoder().decode(Printed.self, from: Data(knnJSON.utf8))
        XCTAssertEqual(knnPrinted.validationAccuracy, knnCompleted.validationAccuracy)
    }

    func testAMalformedValidationSampleIsDeadLetteredNamingIt() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["validationSamples[1]", "'pixels'", "shape [64]"]) { fleet in
            var job = Digits.job(user: "u10", model: fleet.model, rows: 0..<10)
            job.validationSamples = [Digits.sample(20), Digits.sample(21)]
            job.validationSamples[1].features["pixels"]!.multiArray.values.removeLast()
            try fleet.publish(job, as: .json)
        }
    }

    func testValidationSamplesCountAgainstTheJobsSampleLimit() throws {
        // The harness's workers take at most 200 samples per job.
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["at most 200 samples", "150 + 60 validationSamples"]) { fleet in
            var job = Digits.job(user: "u11", model: fleet.model, rows: 0..<150)
            job.validationSamples = (150..<210).map { Digits.sample($0) }
            try fleet.publish(job)
        }
    }

    /// `--validation-split` holds out the end of the rows (as Keras' validation_split); `--validation-csv`
    /// takes other rows; the trained samples are the rest.
    func testEnqueueAttachesAValidationSet() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let csv = Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path
        let split = try attune(fleet, ["enqueue", "--model", fleet.model, "--user", "sam", "--csv", csv, "--rows", "0:50",
                                       "--validation-split", "0.2", "--epochs", "2"])
        let other = try attune(fleet, ["enqueue", "--model", fleet.model, "--user", "sam", "--csv", csv, "--rows", "50:80",
                                       "--validation-csv", csv, "--validation-rows", "200:225", "--epochs", "2",
                                       "--format", "json"])
        let ids = [split, other].map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        let events = try fleet.events(untilEnded: 2)
        for (id, (trained, held)) in zip(ids, [(40, 10), (30, 25)]) {
            let mine = events.filter { $0.jobID == id }
            XCTAssertEqual(mine.last?.samples, Int64(trained), "\(mine)")
            XCTAssertEqual(FleetHarness.epochsReported(mine, job: id).filter(\.hasValidationAccuracy).count, 2)
            XCTAssertEqual(mine.last?.kind, .completed, mine.last?.reason ?? "")
            let version = try XCTUnwrap(fleet.registry.history(user: "sam", model: fleet.model).first { $0.jobId == id })
            let record = try XCTUnwrap(version.validation.flatMap {
                try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            })
            XCTAssertEqual(record["samples"] as? Int, held)
        }
        // The split held out rows 40-49: their accuracy on the committed version is the reported one.
        let base = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Paths.digitsModel)))
        let state = try headState(fleet, user: "sam", model: fleet.model, version: 1)
        let completed = try XCTUnwrap(events.first { $0.jobID == ids[0] && $0.kind == .completed })
        XCTAssertEqual(completed.validationAccuracy,
                       try base.accuracy(samples: (40..<50).map { Digits.sample($0) }, state: state))

        let refused = try ChildProcess.run(Paths.attuneExecutable, ["enqueue", "--model", fleet.model, "--user", "sam",
                                                                    "--csv", csv, "--rows", "0:3", "--validation-split", "1.5"],
                                           environment: ["ATTUNE_AMQP_URL": fleet.amqpURL])
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.output.contains("--validation-split takes a fraction between 0 and 1"), refused.output)
    }
}
