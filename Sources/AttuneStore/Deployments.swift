import Foundation

/// One row of a model's deployment: devices whose `attribute` is `value` get `baseVersion` (attribute nil:
/// every other device, the default).
public struct DeploymentRule: Sendable, Equatable {
    public let model: String
    public let attribute: String?
    public let value: String?
    public let baseVersion: Int
}

extension ModelRegistry {
    /// Points a population (or, without an attribute, the default) at a base version.
    public func setDeployment(model: String, baseVersion: Int, attribute: String? = nil, value: String? = nil) throws {
        guard (attribute == nil) == (value == nil) else {
            throw RegistryError.invalidArgument("a population is an attribute and a value (--where region=eu)")
        }
        guard try connection.query("SELECT 1 FROM attune_base_models WHERE name = $1 AND version = $2",
                                   [model, baseVersion]).rowCount == 1 else {
            throw RegistryError.unknownModel(model, baseVersion)
        }
        try connection.query("""
            INSERT INTO attune_deployments (model, attribute, value, base_version) VALUES ($1, $2, $3, $4)
            ON CONFLICT (model, attribute, value) DO UPDATE SET base_version = $4, updated_at = now()
            """, [model, attribute ?? "", value ?? "", baseVersion])
    }

    @discardableResult
    public func removeDeployment(model: String, attribute: String? = nil, value: String? = nil) throws -> Bool {
        try connection.query("DELETE FROM attune_deployments WHERE model = $1 AND attribute = $2 AND value = $3",
                             [model, attribute ?? "", value ?? ""]).affectedRows == 1
    }

    public func deployments(model: String) throws -> [DeploymentRule] {
        try connection.query("""
            SELECT attribute, value, base_version FROM attune_deployments WHERE model = $1 ORDER BY attribute, value
            """, [model]).rows.map {
                let attribute = try $0.string("attribute")
                return DeploymentRule(model: model, attribute: attribute.isEmpty ? nil : attribute,
                                      value: attribute.isEmpty ? nil : try $0.string("value"),
                                      baseVersion: try $0.int("base_version"))
            }
    }

    /// The base a device with these attributes gets: the first rule (by attribute name) its attributes
    /// match, else the default, else — no deployment at all — the newest import; nil if no such model.
    public func deployedBase(model: String, attributes: [String: String]) throws -> Int? {
        let rules = try deployments(model: model)
        for rule in rules {
            if let attribute = rule.attribute, attributes[attribute] == rule.value { return rule.baseVersion }
        }
        if let fallback = rules.first(where: { $0.attribute == nil }) { return fallback.baseVersion }
        return try newestBaseVersion(name: model)
    }

    public func addToCollection(_ name: String, models: [String]) throws {
        for model in models {
            try connection.query("INSERT INTO attune_collections (name, model) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                 [name, model])
        }
    }

    public func collection(_ name: String) throws -> [String] {
        try connection.query("SELECT model FROM attune_collections WHERE name = $1 ORDER BY model", [name])
            .rows.map { try $0.string("model") }
    }
}
