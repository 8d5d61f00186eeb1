import AttuneCodecs
import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import WorkerTestSupport

/// What a producer's own permissions allow it to do to the fleet, and why it cannot hurt it: an exchange
/// binding that feeds `attune.events` back into `attune.jobs` does not loop, and the drain-barrier header on a
/// job does not park its partition.
final class ProducerMischiefTests: XCTestCase {
    func testEventsFedBackIntoTheJobsExchangeAreDeadLetteredWithoutAnEvent() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let key = "\(fleet.model).*.failed"
        try fleet.publisher.bindExchange(Topology.jobsExchange, to: Topology.eventsExchange, key: key)
        defer { try? fleet.publisher.unbindExchange(Topology.jobsExchange, from: Topology.eventsExchange, key: key) }
        fleet.startWorker(fleet.configuration())
        var refused = Digits.job(user: "loop_ivy", model: fleet.model, rows: 0..<5)
        refused.samples[0].features["digit"]!.stringValue = "eleven"
        try fleet.publish(refused)

        // Its `failed` event goes to the listener and, through the binding, into a partition queue: were it taken
        // for a job, its refusal would publish another `failed`, which would come back, and so on.
        _ = try fleet.events(untilEnded: 1)
        Thread.sleep(forTimeInterval: 3)
        var more: [Attune_V1_Event] = []
        while let delivery = try fleet.listener.nextDelivery(timeout: 0.5) {
            more.append(try EventCodec.decode(delivery.body, contentType: delivery.contentType))
        }
        XCTAssertEqual(more.filter { $0.kind == .failed }.count, 0, "the fed-back event made events: \(more.map(\.kind))")
        let letters = try fleet.deadLetters(expected: 2)
        XCTAssertEqual(letters.count, 2, "the job, and the event the broker dead-lettered")
        XCTAssertEqual(Set(letters.map(\.messageId)), [refused.jobID])
    }

    func testADrainBarrierHeaderOnAJobIsNotBelieved() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let job = Digits.job(user: "barrier_jo", model: fleet.model, rows: 0..<10)
        let after = Digits.job(user: "barrier_jo", model: fleet.model, rows: 10..<20)
        let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
        try JobQueues(fleet.publisher).publishJob(body: body, contentType: contentType, user: job.userID, messageId: job.jobID,
                                                  headers: [Topology.drainBarrierHeader: "0:1"])
        try fleet.publish(after)
        let events = try fleet.events(untilEnded: 2, timeout: 30)
        XCTAssertEqual(events.filter { $0.kind == .completed }.map(\.jobID), [job.jobID, after.jobID],
                       "trained as a job, and the user's next job was not held behind it")
    }
}
